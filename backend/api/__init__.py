"""The HTTP API: the Starlette app, its server, and one route module per system."""
