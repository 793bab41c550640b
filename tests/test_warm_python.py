"""tests/helpers/warm.py: a `python ...` started through the warm server is a process with the
semantics of a fresh one (stdio, status, signals, session, cwd, environment, threads), and what
it cannot serve starts cold."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cmd_env
from helpers import warm

PY = sys.executable


def _popen(code: str, **kw) -> warm.Popen:
    kw.setdefault("env", run_cmd_env())
    return warm.Popen([PY, "-c", code], **kw)


def test_stdio_status_cwd_and_environment_reach_the_child(tmp_path: Path):
    p = _popen("import os, sys; print(os.getcwd(), os.environ['X_WARM'], sys.argv[1:]);"
               "print(input(), file=sys.stderr); sys.exit(3)",
               cwd=tmp_path, env=dict(run_cmd_env(), X_WARM="yes"), stdin=subprocess.PIPE,
               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate("from the test", timeout=60)
    assert p._warm is not None  # it did come from the warm server
    assert p.returncode == 3
    assert out == f"{tmp_path} yes []\n" and err == "from the test\n"


def test_a_script_runs_as_main_with_its_arguments(tmp_path: Path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nif __name__ == '__main__':\n    print(sys.argv, sys.path[0])\n")
    p = subprocess.run([PY, str(script), "a", "b"], env=run_cmd_env(), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == f"{[str(script), 'a', 'b']} {tmp_path}\n"


def test_uncaught_errors_and_sys_exit_messages_end_as_python_ends_them():
    p = subprocess.run([PY, "-c", "raise ValueError('bad')"], env=run_cmd_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.strip().endswith("ValueError: bad")
    assert "Traceback" in p.stderr
    p = subprocess.run([PY, "-c", "import sys; sys.exit('one line')"], env=run_cmd_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr == "one line\n"


def test_signals_session_and_atexit():
    p = _popen("import atexit, os, sys, time; atexit.register(print, 'atexit ran');"
               "print(os.getpgid(0) == os.getpid(), flush=True); time.sleep(60)",
               stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout.readline() == "True\n"  # its own session, as start_new_session asks
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == -signal.SIGTERM
    p = subprocess.run([PY, "-c", "import atexit; atexit.register(print, 'atexit ran')"],
                       env=run_cmd_env(), capture_output=True, text=True, timeout=60)
    assert p.stdout == "atexit ran\n"


def test_ctrl_c_ends_the_child_by_sigint():
    p = _popen("import time; print('up', flush=True); time.sleep(60)", stdout=subprocess.PIPE,
               stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "up\n"
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == -signal.SIGINT and "KeyboardInterrupt" in p.stderr.read()


def test_omp_num_threads_sets_torchs_threads():
    code = "import torch; print(torch.get_num_threads())"
    for n in ("1", "2"):
        p = subprocess.run([PY, "-c", code], env=dict(run_cmd_env(), OMP_NUM_THREADS=n),
                           capture_output=True, text=True, timeout=60)
        assert p.stdout == f"{n}\n", p.stderr


def test_what_the_server_cannot_serve_starts_cold(tmp_path: Path):
    env = run_cmd_env()
    fresh = "import sys; print('torch' in sys.modules)"
    assert subprocess.run([PY, "-c", fresh], env=env, capture_output=True, text=True,
                          timeout=60).stdout == "True\n"  # warm: torch came with the fork
    for argv, e in (([PY, "-O", "-c", fresh], env),  # an interpreter flag
                    ([PY, "-c", fresh], dict(env, MDK_TEST_COLD="1"))):  # asked for
        p = warm.Popen(argv, env=e, stdout=subprocess.PIPE, text=True)
        assert p.communicate(timeout=120)[0] == "False\n" and p._warm is None
    # -u with a script (as submitit starts its tasks) is warm, its output unbuffered: seen before
    # it ends; `-u -c` (how pytest-xdist starts its workers) stays cold
    assert warm._warm_argv([PY, "-u", "-c", fresh], None, False) is None
    script = tmp_path / "slow.py"
    script.write_text(fresh + "\nimport time\ntime.sleep(60)\n")
    p = warm.Popen([PY, "-u", str(script)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "True\n" and p._warm is not None
    p.kill()
    p.wait(timeout=30)
    assert warm._warm_argv([PY, "-c", fresh], None, True) is None  # a shell command


def test_a_start_up_variable_gets_a_server_started_with_it(monkeypatch):
    """PYTHONHASHSEED is read once, at interpreter start: the warm child hashes as a fresh
    python with that seed does (a server of its own), not as the default server would. At most
    LIVE_SERVERS run: the least recently used one ends."""
    code = "print(hash('mdk'))"
    subprocess.run([PY, "-c", "pass"], env=run_cmd_env(), check=True, timeout=60)
    live = dict(warm._procs)
    monkeypatch.setattr(warm, "LIVE_SERVERS", len(live))
    seeded = dict(run_cmd_env(), PYTHONHASHSEED="7")
    cold = subprocess.run([PY, "-c", code], env=dict(seeded, MDK_TEST_COLD="1"),
                          capture_output=True, text=True, timeout=120).stdout
    p = warm.Popen([PY, "-c", code], env=seeded, stdout=subprocess.PIPE, text=True)
    assert p.communicate(timeout=120)[0] == cold and p._warm is not None
    assert len(warm._procs) == len(live)
    ended = [proc for key, proc in live.items() if key not in warm._procs]
    assert len(ended) == 1 and ended[0].wait(timeout=30) == 0


def test_a_warm_childs_own_python_scripts_are_warm_too(tmp_path):
    """A benchmark starts `python run.py ...` itself: from the same server (no server of its
    own), with the same semantics (its status here). Its `-c` children start cold: they may be
    stand-in ranks that must die with it (test_stop_signals)."""
    script = tmp_path / "inner.py"
    script.write_text("import sys; print('torch' in sys.modules); sys.exit(4)\n")
    outer = ("import subprocess, sys\n"
             "for argv in ([sys.argv[1]], ['-c', open(sys.argv[1]).read()]):\n"
             "    p = subprocess.run([sys.executable, *argv], capture_output=True, text=True)\n"
             "    print(p.stdout.strip(), p.returncode)\n")
    p = subprocess.run([PY, "-c", outer, str(script)], env=run_cmd_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.stdout == "True 4\nFalse 4\n", p.stderr


SPAWNING_CHILD = """
import multiprocessing as mp, os, resource, sys
import torch

def report(q):
    import extra_mod  # on the PYTHONPATH this command's environment names
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        t = torch.ones(16 << 20)
        del t
    q.put((extra_mod.NAME, os.getppid(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))

if __name__ == "__main__":
    os.environ["PYTHONPATH"] = sys.argv[1] + os.pathsep + os.environ.get("PYTHONPATH", "")
    if sys.argv[2] == "tuned":
        os.environ["MALLOC_MMAP_THRESHOLD_"] = os.environ["MALLOC_TRIM_THRESHOLD_"] = str(1 << 30)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=report, args=(q,))
    p.start()
    name, parent, faults = q.get(timeout=60)
    p.join(60)
    print(name, parent == os.getpid(), faults // ((64 << 20) // 4096), p.exitcode)
"""


def test_a_warm_childs_spawned_processes_are_its_own_children_with_its_settings(tmp_path):
    """A process a warm child spawns with multiprocessing (a `dist.gpus=2` run's rank) is a fresh
    interpreter, the child's own child (it dies with it), that sees the PYTHONPATH the child set
    before starting it, and glibc's malloc thresholds act in it as in a process started with them
    (as tests/test_malloc.py measures: freed 64 MB tensors are reused, a few page faults per
    buffer instead of one per allocation)."""
    (tmp_path / "extra_mod.py").write_text("NAME = 'extra'\n")
    (tmp_path / "launcher.py").write_text(SPAWNING_CHILD)  # a script: its function pickles
    # without glibc's variables (a launcher in this process may have set them: test_malloc.py)
    env, buffers = {k: v for k, v in run_cmd_env().items() if not k.startswith("MALLOC_")}, {}
    for malloc in ("tuned", "plain"):
        p = subprocess.run([PY, str(tmp_path / "launcher.py"), str(tmp_path), malloc], env=env,
                           capture_output=True, text=True, timeout=120)
        *same, buffers[malloc], code = p.stdout.split()
        assert same == ["extra", "True"] and code == "0", p.stdout + p.stderr
    assert int(buffers["tuned"]) <= 10 and int(buffers["plain"]) >= 38, buffers


def test_an_exec_of_a_python_script_runs_it_in_the_same_warm_process(tmp_path):
    """mdk.tools.quant_report hands its process to run.py with os.execv: in a warm child the
    script runs in place (same pid, warm, its argv and status); another program is a real exec."""
    script = tmp_path / "after.py"
    script.write_text("import os, sys\nprint(os.getpid(), 'torch' in sys.modules, sys.argv[1:])\n"
                      "sys.exit(5)\n")
    before = f"import os, sys; print(os.getpid(), flush=True); os.execv(sys.executable, " \
             f"[sys.executable, {str(script)!r}, 'a'])"
    p = subprocess.run([PY, "-c", before], env=run_cmd_env(), capture_output=True, text=True,
                       timeout=60)
    pid, after = p.stdout.splitlines()
    assert p.returncode == 5 and after == f"{pid} True ['a']", p.stderr
    p = subprocess.run([PY, "-c", "import os; os.execv('/bin/echo', ['echo', 'real exec'])"],
                       env=run_cmd_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "real exec\n"
