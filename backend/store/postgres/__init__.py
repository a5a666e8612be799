"""The PostgreSQL store (a fleet): one module per system, the shared SQL in ``sql``."""
