"""When a progress bar is drawn: one rule for every bar of mdk, ``trainer.progress``. ``auto``:
only when stderr is a terminal (in a log file a bar is hundreds of carriage-return frames per
epoch, and the epoch lines carry its numbers anyway). Only the main process draws.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Iterable, Optional

from tqdm import tqdm

# tqdm's default lock holds a multiprocessing semaphore, which a rank leaving through os._exit
# never unlinks ("leaked semaphore objects" warnings); one process draws, so a thread lock does.
_THREAD_LOCK = threading.RLock()


def bars_on(setting: Any = "auto", is_main: bool = True) -> bool:
    """Whether this process draws bars: ``setting`` is ``trainer.progress`` (auto | true | false)."""
    return is_main and (sys.stderr.isatty() if setting == "auto" else bool(setting))


def progress_bar(iterable: Optional[Iterable] = None, *, setting: Any = "auto",
                 is_main: bool = True, **tqdm_args: Any) -> Any:
    """A tqdm bar on stderr over ``iterable`` (without one, a bar to ``update()`` by hand) when
    bars are on; otherwise ``iterable`` itself, and no tqdm object is made."""
    if not bars_on(setting, is_main):
        return iterable
    tqdm.set_lock(_THREAD_LOCK)
    args = {"dynamic_ncols": True, "leave": False, "file": sys.stderr, **tqdm_args}
    return tqdm(iterable, **args)
