"""What schedtui tells an operator about itself: metrics and per-run logs."""
