"""The command line around Hydra's main: composition errors as one line.

Hydra prints its own composition errors (a wrong type, an unknown key or option) over several
lines and exits. Here Hydra is asked to re-raise them (``HYDRA_FULL_ERROR=1`` while it composes)
and they become ``config error: <one line naming the key and value>`` with exit status 1, like
every other config error; an override its grammar cannot parse names the override, the
character it stopped at and the quoted form to type (``mdk.compose.one_line``). A run dir that
Hydra cannot make or write (a full or read-only disk) is one ``disk error`` line naming it. The
user's own HYDRA_FULL_ERROR setting is put back before the task runs (``restore_full_error``,
first thing in run.py's main) and after the command; with it set, tracebacks are shown as usual.
"""
from __future__ import annotations

import os
import sys
from typing import Callable

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from mdk.compose import one_line
from mdk.errors import error_line

_USER = "MDK_USER_HYDRA_FULL_ERROR"  # the user's HYDRA_FULL_ERROR, carried into sweep jobs


def restore_full_error() -> None:
    """Put the user's HYDRA_FULL_ERROR back (Hydra then reports task errors as it always does)."""
    user = os.environ.get(_USER)
    if user is None:
        return
    if user:
        os.environ["HYDRA_FULL_ERROR"] = user
    else:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def run_cli(main: Callable[[], object]) -> None:
    """Run a ``@hydra.main`` function; Hydra/OmegaConf errors become one ``config error`` line."""
    user = os.environ.get("HYDRA_FULL_ERROR", "")
    os.environ[_USER] = user
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except (HydraException, OmegaConfBaseException) as e:
        if user == "1":
            raise
        sys.exit(f"config error: {one_line(e)}")
    except OSError as e:  # Hydra making the run dir or its files there: a full/read-only disk
        line = error_line(e)
        if user == "1" or line is None:
            raise
        sys.exit(line)
    finally:
        os.environ.pop(_USER, None)
        if user:
            os.environ["HYDRA_FULL_ERROR"] = user
        else:
            os.environ.pop("HYDRA_FULL_ERROR", None)
