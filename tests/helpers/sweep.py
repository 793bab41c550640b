"""python run.py in a subprocess (sweeps and their summaries)."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO, run_cmd_env


def run_py(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=env or run_cmd_env(),
                          capture_output=True, text=True, timeout=timeout)
