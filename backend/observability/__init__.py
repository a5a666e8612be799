"""What schedtui tells an operator about itself: metrics, for the tools operators already run, and per-run logs."""
