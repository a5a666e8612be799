"""The order the suite's files are handed to the workers: the longest first.

The suite runs on three workers a file at a time (``--dist loadfile``). xdist hands out
files by their number of tests, most first, so the fleet files (a few tests of many real
seconds each) came last, and the run ended with one worker on a minute-long file while the
others sat idle. With ``--no-loadscope-reorder`` it keeps the collection's order, which
:func:`tests.conftest.pytest_collection_modifyitems` sorts by these measured seconds
(longest first; a file not listed comes after, in its usual order). Measured from a CI
run's ``--durations=0`` (setup, call and teardown summed per file); refresh with
``PYTEST_ADDOPTS=--durations=0 python -m pytest`` when files grow. A stale figure only
costs balance, never a test.
"""

from __future__ import annotations

__all__ = ["FILE_SECONDS"]

#: Seconds per file, the files above 4 s.
FILE_SECONDS = {
    "test_console_snapshots.py": 85,
    "test_serve_store.py": 70,
    "test_jobs_invariants.py": 70,
    "test_liveness_fleet.py": 69,
    "test_cli.py": 62,
    "test_fuzz.py": 61,
    "test_invariants.py": 54,
    "test_fleet.py": 54,
    "test_console_views.py": 50,
    "test_cli_input.py": 49,
    "test_console_paste.py": 41,
    "test_console_habits.py": 41,
    "test_console_schedule_form.py": 40,
    "test_secrets.py": 34,
    "test_console.py": 34,
    "test_console_keys.py": 30,
    "test_cluster_fleet.py": 30,
    "test_console_jobs.py": 28,
    "test_bad_text.py": 27,
    "test_store.py": 26,
    "test_durable_fleet.py": 24,
    "test_cluster.py": 24,
    "test_fleet_timings.py": 23,
    "test_runtime_fleet.py": 22,
    "test_jobs_fleet.py": 22,
    "test_coordination.py": 22,
    "test_console_ops.py": 21,
    "test_alerts_fleet.py": 21,
    "test_durable.py": 20,
    "test_runtime_invariants.py": 19,
    "test_pooler.py": 19,
    "test_jobs_api.py": 19,
    "test_long_run.py": 18,
    "test_cli_logs.py": 18,
    "test_serve.py": 17,
    "test_audit.py": 17,
    "test_durable_invariants.py": 16,
    "test_locks_fleet.py": 15,
    "test_locks.py": 15,
    "test_events.py": 15,
    "test_console_typing.py": 15,
    "test_console_confirm.py": 15,
    "test_api.py": 14,
    "test_jobs_store.py": 13,
    "test_console_remote.py": 12,
    "test_console_latency.py": 12,
    "test_alerts_props.py": 12,
    "test_metrics.py": 11,
    "test_jobs.py": 10,
    "test_console_durable.py": 10,
    "test_api_input.py": 10,
    "test_alerts.py": 10,
    "test_runtime_schedules.py": 9,
    "test_run_logs.py": 9,
    "test_console_events.py": 9,
    "test_client.py": 9,
    "test_cli_definitions.py": 8,
    "test_engine.py": 7,
    "test_durable_surfaces.py": 7,
    "test_contract.py": 7,
    "test_console_unprintable.py": 7,
    "test_runtime_surfaces.py": 6,
    "test_runner.py": 6,
    "test_locks_props.py": 6,
    "test_isolation.py": 6,
    "test_console_logs.py": 6,
    "test_console_locks.py": 6,
    "test_console_health.py": 6,
    "test_server_faults.py": 5,
    "test_relay_props.py": 5,
    "test_liveness.py": 5,
    "test_store_roles.py": 4,
    "test_path_names.py": 4,
    "test_manifests.py": 4,
    "test_locks_surfaces.py": 4,
    "test_instance_names.py": 4,
    "test_engine_lifecycle.py": 4,
    "test_clock_skew.py": 4,
    "test_cli_derived.py": 4,
    "test_backfill_ends.py": 4,
}
