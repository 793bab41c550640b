"""When a progress bar is drawn: one rule for every bar of mdk (training, evaluation,
calibration, the image check), set by ``trainer.progress``.

* ``auto`` (default): a bar only when stderr is a terminal. In a file (a SLURM log,
  ``python run.py > run.log 2>&1``) a bar is a line of hundreds of carriage-return frames per
  epoch, and the epoch lines already carry its numbers.
* ``true``: bars even in a file. ``false``: never a bar.

Only the run's main process draws (``is_main``).
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Iterable, Optional

from tqdm import tqdm

# tqdm's default lock also holds a multiprocessing RLock: a named semaphore, which a rank that
# leaves through os._exit (launchers/processes/env.py leave_process) never unlinks, so the
# launching process printed "resource_tracker: There appear to be 1 leaked semaphore objects"
# after every multi-process run with a bar. Bars are drawn by one process only: a thread lock
# is all they need.
_THREAD_LOCK = threading.RLock()


def bars_on(setting: Any = "auto", is_main: bool = True) -> bool:
    """Whether this process draws bars: ``setting`` is ``trainer.progress`` (auto | true | false)."""
    if not is_main:
        return False
    if setting == "auto":
        return sys.stderr.isatty()
    return bool(setting)


def progress_bar(iterable: Optional[Iterable] = None, *, setting: Any = "auto",
                 is_main: bool = True, **tqdm_args: Any) -> Any:
    """A tqdm bar on stderr over ``iterable`` (or, without one, a bar to ``update()`` by hand)
    when ``bars_on(setting, is_main)``; otherwise ``iterable`` itself (None without one), and
    no tqdm object is made at all."""
    if not bars_on(setting, is_main):
        return iterable
    tqdm.set_lock(_THREAD_LOCK)
    args = {"dynamic_ncols": True, "leave": False, "file": sys.stderr, **tqdm_args}
    return tqdm(iterable, **args)
