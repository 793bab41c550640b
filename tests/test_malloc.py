"""launchers.processes.malloc: freed tensor memory is reused, not re-faulted from the kernel."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

# Allocate, touch and free a 64 MB tensor 40 times; print the minor page faults that caused.
PROBE = """
import resource, sys
sys.path.insert(0, {repo!r})
if sys.argv[1] == "tuned":
    from launchers.processes.malloc import tune_malloc
    assert tune_malloc()
import torch
torch.ones(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    t = torch.ones(16 << 20)
    del t
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str, **env: str) -> int:
    e = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    e.update(env, MDK_TEST_COLD="1")  # a fresh process's malloc (tests/helpers/warm.py)
    p = subprocess.run([sys.executable, "-c", PROBE.format(repo=str(REPO)), mode], env=e,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.split()[-1])


PAGES = (64 << 20) // 4096  # pages of one buffer


def test_tuned_process_reuses_freed_memory():
    plain, tuned = faults("plain"), faults("tuned")
    assert plain >= 38 * PAGES        # every round trip re-faults the whole buffer (measured: 40x)
    assert tuned <= 10 * PAGES        # tuned: the first few allocations only (measured: 7x)


def test_children_inherit_the_setting():
    from launchers.processes.malloc import tune_malloc

    saved = {k: os.environ.pop(k, None) for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    try:
        assert tune_malloc()
        env = {k: os.environ[k] for k in saved}
        # a child started with that environment (spawned rank, torchrun rank) is tuned by glibc
        assert faults("plain", **env) <= 10 * PAGES
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def test_opt_out(monkeypatch):
    from launchers.processes.malloc import tune_malloc

    monkeypatch.setenv("MDK_MALLOC_TUNE", "0")
    assert tune_malloc() is False
