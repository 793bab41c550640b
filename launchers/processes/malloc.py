"""Keep freed tensor memory in the process instead of handing it back to the kernel (glibc only).

glibc mmaps allocations above a threshold and unmaps them on free, and trims the heap's top: a
CPU training step frees and re-faults the same activation-sized buffers every iteration
(measured: benchmarks/README.md, "malloc"). Raising both thresholds makes glibc reuse them; the
process keeps its peak heap until it exits (peak RSS itself does not grow).
"""
from __future__ import annotations

import ctypes
import os
import sys

_THRESHOLD = 1 << 30   # 1 GiB: larger than any single activation of the models we ship
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
# glibc's variables for the same two settings (read once, when a process starts): name -> param
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": _M_MMAP_THRESHOLD,
              "MALLOC_TRIM_THRESHOLD_": _M_TRIM_THRESHOLD}


def tune_malloc() -> bool:
    """Apply to this process and (through glibc's environment variables) to the processes it
    starts: spawned ranks, torchrun ranks, DataLoader workers. Returns True when applied.
    ``MDK_MALLOC_TUNE=0`` leaves malloc alone (e.g. when you preload jemalloc or tcmalloc)."""
    if os.environ.get("MDK_MALLOC_TUNE", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, _THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, _THRESHOLD) == 1
    for name in MALLOC_ENV:
        os.environ.setdefault(name, str(_THRESHOLD))
    return ok
