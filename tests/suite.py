"""The test command: `python tests/suite.py [pytest args]` (installs ./.venv on first use)."""
import os
import sys
from pathlib import Path


def main() -> int:
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    from launchers.bootstrap import ensure_environment

    ensure_environment()
    import pytest

    os.chdir(repo)
    return pytest.main(["tests", *sys.argv[1:]])


# Guarded: worker processes started with 'spawn' re-import the main module, and must not start
# the whole suite again inside themselves.
if __name__ == "__main__":
    sys.exit(main())
