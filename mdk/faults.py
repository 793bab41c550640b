"""Fault injection for the tests: ``MDK_FAULT=<action>:<point>:<n>[:<rank>[:<Class|code>]],...``
kills, poisons, raises, exits or holds a real ``run.py`` at an exact point, chosen by count
(the actions: docs/errors.md, "Fault injection"). ``iter`` counts optimizer steps 1-based over
the whole stage, so a resumed process counts on from the checkpoint; a ``kill:iter`` comes before
the step's checkpoint hook. Off, the cost is one dictionary lookup per call.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from collections import Counter
from typing import Any, Callable, Optional

import torch

from mdk.errors import user_errors
from mdk.stop import stop_requested

log = logging.getLogger(__name__)

ENV = "MDK_FAULT"
HOLD_S = 20.0
# A hold also ends once this file exists: a test that is done with the held state releases the
# run at once instead of leaving it to wait out HOLD_S.
RELEASE_ENV = "MDK_FAULT_RELEASE"
_calls: Counter = Counter()


class InjectedError(RuntimeError):
    """What ``raise:<point>:N`` raises: stands for a bug in one rank."""


POINTS = ("iter", "eval", "save", "item", "start")
Spec = tuple[str, str, int, int, Optional[str]]  # its 5th field: a raise's class, an exit code


def _specs() -> list[Spec]:
    raw = os.environ.get(ENV, "").strip()
    out = []
    for item in filter(None, (s.strip() for s in raw.split(","))):
        parts = item.split(":")
        if len(parts) not in (3, 4, 5) or parts[0] not in ("kill", "nan", "hold", "raise", "exit") or \
                parts[1] not in POINTS:
            raise ValueError(f"{ENV}={raw!r}: bad item {item!r}; use "
                             f"<kill|nan|hold|raise|exit>:<{'|'.join(POINTS)}>:<n>[:rank[:Class|code]]")
        out.append((parts[0], parts[1], int(parts[2]), int(parts[3]) if len(parts) >= 4 else 0,
                    parts[4] if len(parts) == 5 else None))
    return out


def _error(name: str, point: str, n: int, rank: int) -> BaseException:
    known = {"InjectedError": InjectedError, **{c.__name__: c for c in user_errors()}}
    if name not in known:
        raise ValueError(f"{ENV}: unknown error class {name!r}; use one of {sorted(known)}")
    return known[name](f"{ENV}: injected {name} at {point} {n} on rank {rank}")


def enabled() -> bool:
    return bool(os.environ.get(ENV))


_this: dict[str, int] = {"rank": 0}


def set_rank(rank: int) -> None:
    """The rank whose faults this process takes (default 0); forked loader workers inherit it."""
    _this["rank"] = int(rank)


def _flush_logs() -> None:
    for h in logging.getLogger().handlers:  # so the test log shows where the process died
        h.flush()


def at(point: str, n: int | None = None) -> None:
    """Act on a fault at ``point`` that matches; ``n`` defaults to a per-point call count."""
    if not enabled():
        return
    if n is None:
        _calls[point] += 1
        n = _calls[point]
    for action, p, k, rank, extra in _specs():
        if (p, k, rank) != (point, n, _this["rank"]):
            continue
        if action == "kill":
            log.warning("%s: injected SIGKILL at %s %d", ENV, point, n)
            _flush_logs()
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "hold":
            # the pid: a test signals this process by it (a process's command line need not say
            # which one holds)
            log.warning("%s: holding at %s %d (pid %d) until a stop is requested (at most %.0f s)",
                        ENV, point, n, os.getpid(), HOLD_S)
            release = os.environ.get(RELEASE_ENV)
            end = time.monotonic() + HOLD_S
            while stop_requested() is None and time.monotonic() < end and not (
                    release and os.path.exists(release)):
                time.sleep(0.02)
        elif action == "exit":
            code = int("1" if extra is None else extra)
            log.warning("%s: injected exit with code %d at %s %d", ENV, code, point, n)
            _flush_logs()
            os._exit(code)
        elif action == "raise":
            if extra is None:
                raise InjectedError(f"{ENV}: injected error at {point} {n} on rank {rank}")
            raise _error(extra, point, n, rank)


def wrap(point: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if not enabled():
        return fn

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        at(point)
        return fn(*args, **kwargs)

    return wrapped


def poison_loss(trainer: Any) -> None:
    if not enabled():
        return
    it = trainer.iter + 1
    if ("nan", "iter", it, _this["rank"]) not in [spec[:4] for spec in _specs()]:
        return
    terms = trainer.loss_terms
    victim = next((k for k in terms if k != "total"), "total")
    # on the loss's own device: a CPU NaN among CUDA terms would be a fault of the injection
    nan = torch.full_like(terms["total"].detach(), float("nan"))
    terms[victim] = terms["total"] = nan
    for p in trainer.model.parameters():
        if p.grad is not None:
            p.grad.fill_(float("nan"))
    log.warning("%s: injected NaN into loss term %r at iteration %d", ENV, victim, it)
