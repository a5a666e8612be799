"""What an install ships: the files beside the code that a normal (not editable) install
must carry, as setuptools copies them into a wheel from pyproject's package data."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_an_install_ships_the_packages_typed_and_the_consoles_files(tmp_path: Path) -> None:
    """Without py.typed a user's mypy saw ``from backend import connect`` as a module with
    no types ("missing library stubs or py.typed marker"), although every public function
    is annotated. The packages are built as a wheel's contents are (setuptools' build_py,
    offline), from a copy of the sources, and what came out is looked at."""
    pytest.importorskip("setuptools")
    for package in ("backend", "console"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    built = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py", "--build-lib", "lib"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    lib = tmp_path / "lib"
    shipped = {path.relative_to(lib).as_posix() for path in lib.rglob("*") if path.is_file() and path.suffix != ".py"}
    assert {"backend/py.typed", "console/py.typed", "console/console.tcss"} <= shipped, sorted(shipped)
    for demo in ("daily_digest.cron.py", "mailer.jobs.py", "release.durable.py"):  # every kind the demo defines
        assert (lib / "console/demo_schedules" / demo).exists(), demo
