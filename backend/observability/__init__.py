"""Observability: what an engine tells the tools operators already run (metrics, logs)."""
