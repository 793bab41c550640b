"""The test command: `python tests/suite.py [pytest args]` (installs ./.venv on first use)."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launchers.bootstrap import ensure_environment  # noqa: E402

ensure_environment()

import pytest  # noqa: E402

os.chdir(Path(__file__).resolve().parents[1])
sys.exit(pytest.main(["tests", *sys.argv[1:]]))
