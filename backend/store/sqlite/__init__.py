"""The SQLite store (embedded, one file): one module per system, the SQL in ``sql``."""
