"""Change signals (the bus, and how they travel between processes) and the audit log."""
