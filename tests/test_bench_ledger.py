"""The benchmarks' big ledger (tests/bench/ledger.py) has the very schema the store creates.

A ledger lacking a component's tables or indexes is migrated by the store at its first open,
and every copy the benchmarks take is a first open: the console benchmark's first screen
then timed the components' indexes being built over a million runs (seconds), not the
console. Built small here; the same code builds the big one.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from backend import open_store
from tests.bench.ledger import build_ledger


def schema(db: Path) -> set[tuple[str, str, str]]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT type, name, coalesce(sql, '') FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        return {(kind, name, " ".join(sql.split())) for kind, name, sql in rows}
    finally:
        conn.close()


def versions(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        found = dict(conn.execute("SELECT component, version FROM schema_components").fetchall())
        found["core"] = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        return found
    finally:
        conn.close()


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_ledger(tmp_path_factory.mktemp("ledger"), schedules=12, runs=3000, cache=False).db_path


async def test_ledger_has_the_schema_of_a_fresh_store(ledger: Path, tmp_path: Path) -> None:
    fresh = open_store(f"sqlite:///{tmp_path / 'fresh.db'}")
    await fresh.open()
    await fresh.close()
    assert schema(ledger) == schema(tmp_path / "fresh.db")
    assert versions(ledger) == versions(tmp_path / "fresh.db")


async def test_opening_the_ledger_migrates_nothing(ledger: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = schema(ledger)
    store = open_store(f"sqlite:///{ledger}")
    with caplog.at_level(logging.INFO, logger="schedtui.store"):
        await store.open()
        await store.close()
    assert [r.getMessage() for r in caplog.records if "migrated" in r.getMessage()] == []
    assert schema(ledger) == before
