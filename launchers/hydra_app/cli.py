"""The command line around Hydra's main: composition and run-dir errors as one line, stop
signals as one line and 128 + the signal (docs/errors.md). Hydra re-raises composition errors
only with ``HYDRA_FULL_ERROR=1``, so that is set while it composes; the user's own value is put
back before the task runs and after the command.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Callable

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from launchers.hydra_app.job_ends import JobsEndedError
from launchers.processes.env import detect
from launchers.processes.stop_signals import stop_signals
from launchers.reports.stop_line import stop_line, stop_status
from mdk.compose import one_line
from mdk.errors import error_line
from mdk.stop import StopRequested

log = logging.getLogger(__name__)
_USER = "MDK_USER_HYDRA_FULL_ERROR"  # the user's HYDRA_FULL_ERROR, carried into sweep jobs


def restore_full_error() -> None:
    """Put the user's HYDRA_FULL_ERROR back, so Hydra reports task errors as usual."""
    user = os.environ.get(_USER)
    if user:
        os.environ["HYDRA_FULL_ERROR"] = user
    elif user is not None:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def run_cli(main: Callable[[], object]) -> None:
    """Run a ``@hydra.main`` function; Hydra/OmegaConf errors become one ``config error`` line."""
    user = os.environ.get("HYDRA_FULL_ERROR", "")
    os.environ[_USER] = user
    os.environ["HYDRA_FULL_ERROR"] = "1"
    # A torchrun rank: its agent passes signals on and decides when to kill (repeats ignored).
    kind = "rank" if detect().source == "torchrun" else "launcher"
    try:
        with stop_signals(kind):
            main()
    except (HydraException, OmegaConfBaseException) as e:
        if user == "1":
            raise
        sys.exit(f"config error: {one_line(e)}")
    except StopRequested as e:
        print(getattr(e, "line", None) or stop_line(e), file=sys.stderr, flush=True)
        sys.exit(stop_status(e))
    except JobsEndedError as e:  # sweep jobs without a result
        for line in e.lines:
            log.error("%s", line)
        print("\n".join(e.lines), file=sys.stderr, flush=True)
        sys.exit(e.code)
    except OSError as e:  # Hydra making the run dir or its files there: a full/read-only disk
        line = error_line(e)
        if user == "1" or line is None:
            raise
        sys.exit(line)
    finally:
        restore_full_error()
        os.environ.pop(_USER, None)
