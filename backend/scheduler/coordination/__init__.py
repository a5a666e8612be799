"""Who fires a slot when several instances share a store: ``single``, ``advisoryLock``
(slot claims) and ``cluster`` (shards)."""
