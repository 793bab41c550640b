"""Keep freed tensor memory in the process instead of handing it back to the kernel (glibc only).

glibc serves allocations above a threshold (128 KB at first, adapting up to 32 MB) with a fresh
mmap and unmaps them on free; the top of the heap is also trimmed on free. A CPU training step
allocates and frees the same activation-sized buffers every iteration, so each step re-faults
hundreds of MB of zeroed pages: on the default run that was a third of all CPU time spent in the
kernel (sys 175 s of 531 s) and 30 % of wall time. Raising both thresholds makes glibc reuse the
freed memory; the price is that the process keeps its peak heap until it exits (peak RSS itself
does not grow). PyTorch's CPU performance guide suggests jemalloc/tcmalloc for the same reason;
this gets most of the gain with nothing to install.
"""
from __future__ import annotations

import ctypes
import os
import sys

_THRESHOLD = 1 << 30   # 1 GiB: larger than any single activation of the models we ship
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


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
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(_THRESHOLD))
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(_THRESHOLD))
    return ok
