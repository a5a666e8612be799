"""The scheduler: the engine facade and the parts that fire schedules (timers, catch-up,
backfills, the launcher, the run ledger, the instance registry, the lifecycle)."""
