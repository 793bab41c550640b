"""Fault injection for the resume and NaN tests: kill -9 or a NaN loss at a chosen point.

Off unless ``MDK_FAULT`` is set: a comma-separated list of ``<action>:<point>:<n>[:<rank>]``
(``rank`` default 0), so a test can make a real ``run.py`` die at an exact iteration.

* ``kill:iter:N``  SIGKILL right after optimizer step N (1-based over the whole stage, so a
  resumed process counts on from the checkpoint), before its checkpoint hook;
* ``kill:eval:N``  SIGKILL on entering this process's N-th evaluation;
* ``kill:save:N``  SIGKILL in the N-th checkpoint write, after the fsync, before the rename;
* ``nan:iter:N``   make the loss of iteration N (and its gradients) NaN;
* ``raise:iter:N`` after step N, raise InjectedError (a bug in one rank);
  ``raise:<point>:N:<rank>:<Class>`` raises that user-error class instead, at ``iter`` (a rank),
  ``item`` (a loader worker's N-th training sample) or ``start`` (the launching process);
* ``exit:iter:N:<rank>:<code>`` after step N, ``os._exit(code)`` (a rank dying in a C library);
* ``hold:iter:N``  after step N, wait until a stop is requested or HOLD_S pass, so a test can
  signal a job at a known iteration (changes no numbers).

Off, the cost is one dictionary lookup per call.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from collections import Counter
from typing import Any, Callable

import torch

from mdk.errors import user_errors
from mdk.stop import stop_requested

log = logging.getLogger(__name__)

ENV = "MDK_FAULT"
HOLD_S = 20.0
_calls: Counter = Counter()


class InjectedError(RuntimeError):
    """What ``raise:<point>:N`` raises: stands for a bug in one rank."""


POINTS = ("iter", "eval", "save", "item", "start")
_CLASSES: dict[str, str] = {}  # per item: its 5th field (a raise fault's class, an exit code)


def _specs() -> list[tuple[str, str, int, int]]:
    raw = os.environ.get(ENV, "").strip()
    out = []
    for item in filter(None, (s.strip() for s in raw.split(","))):
        parts = item.split(":")
        if len(parts) not in (3, 4, 5) or parts[0] not in ("kill", "nan", "hold", "raise", "exit") or \
                parts[1] not in POINTS:
            raise ValueError(f"{ENV}={raw!r}: bad item {item!r}; use "
                             f"<kill|nan|hold|raise|exit>:<{'|'.join(POINTS)}>:<n>[:rank[:Class|code]]")
        spec = (parts[0], parts[1], int(parts[2]), int(parts[3]) if len(parts) >= 4 else 0)
        if len(parts) == 5:
            _CLASSES[str(spec)] = parts[4]
        out.append(spec)
    return out


def _error(spec: tuple[str, str, int, int]) -> BaseException:
    name = _CLASSES.get(str(spec), "InjectedError")
    known = {"InjectedError": InjectedError, **{c.__name__: c for c in user_errors()}}
    if name not in known:
        raise ValueError(f"{ENV}: unknown error class {name!r}; use one of {sorted(known)}")
    _, point, n, rank = spec
    return known[name](f"{ENV}: injected {name} at {point} {n} on rank {rank}")


def enabled() -> bool:
    return bool(os.environ.get(ENV))


_this: dict[str, int] = {"rank": 0}


def set_rank(rank: int) -> None:
    """The rank whose faults this process takes (default 0); forked loader workers inherit it."""
    _this["rank"] = int(rank)


def _rank() -> int:
    return _this["rank"]


def _kill(where: str) -> None:
    log.warning("%s: injected SIGKILL %s", ENV, where)
    for h in logging.getLogger().handlers:  # so the test log shows where the process died
        h.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def at(point: str, n: int | None = None) -> None:
    """Act on a fault at ``point`` that matches; ``n`` defaults to a per-point call count."""
    if not enabled():
        return
    if n is None:
        _calls[point] += 1
        n = _calls[point]
    for action, p, k, rank in _specs():
        if action == "kill" and p == point and k == n and rank == _rank():
            _kill(f"at {point} {n}")
        if action == "hold" and p == point and k == n and rank == _rank():
            _hold(f"at {point} {n}")
        if action == "exit" and p == point and k == n and rank == _rank():
            code = int(_CLASSES.get(str((action, p, k, rank)), "1"))
            log.warning("%s: injected exit with code %d at %s %d", ENV, code, point, n)
            for h in logging.getLogger().handlers:
                h.flush()
            os._exit(code)
        if action == "raise" and p == point and k == n and rank == _rank():
            if str((action, p, k, rank)) not in _CLASSES:
                raise InjectedError(f"{ENV}: injected error at {point} {n} on rank {rank}")
            raise _error((action, p, k, rank))


def _hold(where: str) -> None:
    log.warning("%s: holding %s until a stop is requested (at most %.0f s)", ENV, where, HOLD_S)
    end = time.monotonic() + HOLD_S
    while stop_requested() is None and time.monotonic() < end:
        time.sleep(0.02)


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
    if not any(a == "nan" and p == "iter" and k == it and r == _rank() for a, p, k, r in _specs()):
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
