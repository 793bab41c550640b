"""The test command: `python tests/suite.py [pytest args]` (installs ./.venv on first use).

The tests run in parallel, one pytest-xdist worker per core (at most 4): most of them wait on
processes they start or use one thread, so one at a time leaves cores idle. A module's tests stay
on one worker (its module fixtures are made once) and the SLURM tests share one (one cluster):
tests/conftest.py groups them. ``-n 0`` runs everything in this process, one test at a time;
test files or node ids given run alone (``python tests/suite.py tests/test_ddp.py``). The
workers take the groups with the most ``slow`` tests first (tests/conftest.py).
The ``python run.py ...`` commands tests start fork from an interpreter that has imported torch
and mdk already (tests/helpers/warm.py); ``MDK_TEST_COLD=1`` starts each one fresh instead.
"""
import os
import sys
from pathlib import Path

MAX_WORKERS = 4


def main() -> int:
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    from launchers.bootstrap import ensure_environment

    ensure_environment()
    import pytest

    cwd, args = Path.cwd(), sys.argv[1:]
    # Test files / node ids named on the command line (from wherever it runs): only those.
    named = [i for i, a in enumerate(args)
             if not a.startswith("-") and (cwd / a.split("::")[0]).exists()]
    for i in named:
        args[i] = str(cwd / args[i])
    os.chdir(repo)
    if not any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in args):
        workers = min(MAX_WORKERS, len(os.sched_getaffinity(0)))
        # --no-loadscope-reorder: the groups in conftest's order (most slow tests first), not
        # pytest-xdist's (most tests first: 80 short config checks before the chains)
        args = (["-n", str(workers), "--dist", "loadgroup", "--no-loadscope-reorder", *args]
                if workers > 1 else args)
    return pytest.main(args if named else ["tests", *args])


# Guarded: worker processes started with 'spawn' re-import the main module, and must not start
# the whole suite again inside themselves.
if __name__ == "__main__":
    sys.exit(main())
