"""A DataLoader whose worker errors end the run at once, as the same one-line error (docs/errors.md,
"Bad images").

Why a plain one hangs: the worker's exception re-raised in the main process forms a reference
cycle with the iterator, whose ``__del__`` then never stops the workers; at exit
``multiprocessing`` joins them, SIGTERM-deaf (SLURM preemption:
``mdk.engine.build.init_loader_worker``), and a forced ``gc.collect()`` is too late (the queues'
feeder threads have stopped). :class:`SafeLoader` shuts them down while the queues are alive; the
worker's traceback is kept as a note (``HYDRA_FULL_ERROR=1``).
"""
from __future__ import annotations

import logging
import re
from typing import Any, Iterator

from torch.utils.data import DataLoader

from mdk.errors import UserError

log = logging.getLogger(__name__)

_WRAPPED = re.compile(r"^Caught (\w+) (in DataLoader worker process \d+|in pin memory thread[^.]*)\.\n")


def unwrap_worker_error(exc: BaseException) -> BaseException:
    """A user error (``UserError``) a DataLoader re-raised from a worker, as a new one of its class
    with the worker's own message (the traceback kept as a note); any other exception unchanged."""
    if not isinstance(exc, UserError) or not exc.args or not isinstance(exc.args[0], str):
        return exc  # a bug keeps torch's message: the worker's traceback is what helps there
    text = exc.args[0]
    head = _WRAPPED.match(text)
    if head is None:
        return exc
    # The traceback ends with "<module>.<Class>: <message>" (the message may span lines).
    found = list(re.finditer(rf"^(?:[\w.]+\.)?{re.escape(head.group(1))}: ", text, re.M))
    if not found:
        return exc
    clean = type(exc)(text[found[-1].end():].strip())
    note = f"raised {head.group(2)}; its traceback:\n{text[head.end():].rstrip()}"
    if hasattr(clean, "add_note"):  # Python >= 3.11
        clean.add_note(note)
    return clean


def shutdown_workers(iterator: Any) -> None:
    """Stop the worker processes of a DataLoader iterator now (what its ``__del__`` does)."""
    stop = getattr(iterator, "_shutdown_workers", None)  # only the multi-process iterator has it
    if stop is not None:
        stop()


class SafeIterator:
    """A DataLoader iterator whose error stops the workers first; other attributes are its own."""

    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it

    def __iter__(self) -> "SafeIterator":
        return self

    def __next__(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            raise
        except BaseException as exc:
            log.debug("stopping the loader workers after %s", type(exc).__name__)
            shutdown_workers(self._it)
            clean = unwrap_worker_error(exc)
            if clean is exc:
                raise
            raise clean from None

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


class SafeLoader(DataLoader):
    """``torch.utils.data.DataLoader`` (same arguments) that stops its workers as soon as an error
    leaves an iteration, a worker's user error arriving as its own one line."""

    def __iter__(self) -> SafeIterator:
        return SafeIterator(super().__iter__())

    def close(self) -> None:
        """Stop persistent workers now: a loader in a reference cycle (a trainer and its hooks)
        is not freed before exit joins its SIGTERM-deaf workers, a hang (module docstring)."""
        it = getattr(self, "_iterator", None)
        if it is not None:
            shutdown_workers(it)
            self._iterator = None
