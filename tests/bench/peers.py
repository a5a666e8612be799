"""Peers for the benchmarks that compare against them, installed by the benchmark itself
(never by the tests or CI): ``pip install --target`` into a folder under the system's
temporary directory, reused by later runs, and put on ``sys.path`` and ``PYTHONPATH`` (for
the benchmark's own child processes)."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ensure"]


def ensure(requirement: str, module: str) -> None:
    """Make ``module`` importable, installing ``requirement`` first when it is not."""
    try:
        importlib.import_module(module)
        return
    except ImportError:
        pass
    target = Path(tempfile.gettempdir()) / "schedtui-bench-peers" / re.sub(r"[^A-Za-z0-9.]+", "-", requirement)
    if not target.exists():
        print(f"installing {requirement} into {target}", file=sys.stderr)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(target),
             requirement],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"could not install {requirement}:\n{done.stderr[-3000:]}")
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    importlib.invalidate_caches()
    importlib.import_module(module)
