"""Start the suite's ``python run.py ...`` processes from an interpreter that has already imported
torch, torchvision, Hydra and mdk (a "warm" server, one per test process), instead of a fresh
``python`` that spends ~6 s of CPU importing them first.

A test still gets a real, separate process: its own pid, the stdin/stdout/stderr the test asked
for, the cwd and environment, ``start_new_session``, its exit status or the signal that killed it
(``subprocess.Popen`` semantics, through ``Popen`` below: a drop-in subclass). The server forks
(the child then runs the script as ``__main__``, exactly as ``python script.py`` would), so what
differs from a fresh interpreter is only what the imports did, and the composes the server made
once (warm_server.WARM_COMPOSES: Hydra's plugin scan and first-use imports done). So each
server is started with the settings read at start-up (``PYTHON*``, ``LD_*``, ``OMP_*``, malloc and
torch variables) that its children have: one server per such environment a test uses. A command
with interpreter flags starts cold. A few are applied in the child instead, as a fresh interpreter
would have them: ``PYTHONPATH`` (``sys.path``), glibc's
``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` (``mallopt``, what glibc does with them at
start), ``OMP_NUM_THREADS`` (``torch.set_num_threads``: libgomp read the server's) and
``CUDA_VISIBLE_DEVICES`` (read when CUDA starts, in the child); so the server itself starts without
them. ``-u`` is the one interpreter flag served warm (the child's stdio writes through). An
``os.execv`` of this python with a script runs the script in place (warm_server.py).
``MDK_TEST_COLD=1`` in the environment (the suite's, or one command's): start cold. A warm child's
own ``python script.py`` commands (a benchmark's ``run.py`` runs) are forked by the same server,
and submitit's local controller and tasks (WARM_MODULES); its other ``-c``/``-m`` children start
cold (they may rely on dying with their parent), and so do the ranks a ``dist.gpus=2`` command
spawns: fresh interpreters, its own children, that die with it.

This module is the client (conftest puts its ``Popen`` in place); the server is warm_server.py.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

from launchers.processes.malloc import MALLOC_ENV  # glibc's variable -> mallopt parameter

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("warm_server.py")
# Environment read while starting or importing: a child whose values differ starts cold.
STARTUP_ENV = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "TORCH_",
               "TORCHINDUCTOR_", "TORCHDYNAMO_", "DNNL_", "ONEDNN_", "ATEN_", "CUDA_", "MDK_VENV",
               "MDK_NO_BOOTSTRAP")
THREADS = "OMP_NUM_THREADS"  # applied in the child (torch.set_num_threads)
# Set in the child, not the server. CUDA_VISIBLE_DEVICES (submitit sets it for its jobs) is read
# when CUDA starts, which the server never does: the child's environment is enough.
APPLIED = (THREADS, "PYTHONPATH", *MALLOC_ENV, "CUDA_VISIBLE_DEVICES")
UNBUFFERED = "-u"  # the one interpreter flag a warm child takes (its stdio writes through)
# `-m` modules a warm child may start warm: submitit's local job controller and its tasks (they
# need not die with their parent; other -m/-c children may be stand-in ranks that must).
WARM_MODULES = ("submitit.local._local", "submitit.core._submit")
_COLD = subprocess.Popen  # the real one (conftest puts Popen below in its place)


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_ENV) and k not in APPLIED}


def _server_key(env: dict[str, str]) -> tuple:
    """Which server a command with ``env`` needs: its start-up settings."""
    return tuple(sorted(_startup_env(env).items()))


LIVE_SERVERS = 3  # per test process (each holds ~0.5 GB): the least recently used one ends
_servers: "OrderedDict[tuple, Optional[str]]" = OrderedDict()  # start-up env -> socket or None
_procs: dict[tuple, subprocess.Popen] = {}  # a server ends when its stdin (ours) closes
_own_socket = ""  # in a server and its children: the server's socket


def _server(env: dict[str, str]) -> Optional[str]:
    """The socket of the server for ``env``'s start-up settings (started on first use; inside a
    warm child only its own server's)."""
    key = _server_key(env)
    if key in _servers:
        _servers.move_to_end(key)
        return _servers[key]
    if _own_socket:
        return None
    while len(_procs) >= LIVE_SERVERS:
        old = next(k for k in _servers if k in _procs)
        _procs.pop(old).stdin.close()
        del _servers[old]
    # This process's environment with the child's start-up settings: the server itself reads
    # only those (each child gets its own environment).
    start_env = {k: v for k, v in os.environ.items() if not k.startswith(STARTUP_ENV)}
    start_env.update(dict(key))
    folder = tempfile.mkdtemp(prefix="mdk-warm-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    sock = os.path.join(folder, "s")
    proc = _COLD([sys.executable, str(SERVER), "serve", sock], cwd=REPO, env=start_env,
                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                 text=True)
    if proc.stdout.readline().strip() == "ready":
        _procs[key], _servers[key] = proc, sock
    else:  # no warm start for this environment: its commands start cold
        proc.kill()
        _servers[key] = None
    return _servers[key]


def _warm_argv(args: Any, executable: Any, shell: bool) -> Optional[list[str]]:
    """``args`` without the interpreter, when it is this python with a script, -m or -c."""
    if shell or executable is not None or isinstance(args, (str, bytes)) or len(args) < 2:
        return None
    argv = [os.fspath(a) for a in args]
    if argv[0] != sys.executable:
        return None
    if argv[1] == UNBUFFERED:  # unbuffered stdio: the child's streams write through
        rest = _warm_argv([argv[0], *argv[2:]], None, False)
        # only a script or submitit's -m modules: `-u -c` is how pytest-xdist starts its workers
        # (this module's Popen is in place when they start), and they must start cold
        return [UNBUFFERED, *rest] if rest and _warm_even_nested(rest) else None
    if argv[1] in ("-m", "-c"):
        return argv[1:] if len(argv) >= 3 else None
    return argv[1:] if argv[1].endswith(".py") else None


def _warm_even_nested(argv: list[str]) -> bool:
    """Whether a warm child's own command ``argv`` (no interpreter, no ``-u``) may be warm too:
    a script or one of WARM_MODULES."""
    return argv[0].endswith(".py") or argv[:2] in (["-m", m] for m in WARM_MODULES)


class Popen(_COLD):
    """``subprocess.Popen`` that starts eligible ``python`` commands from the warm server."""
    _warm: Optional[socket.socket] = None
    _warm_buf = b""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, *rest):
        full = dict(os.environ if env is None else env)
        argv = _warm_argv(args, executable, shell)
        plain = (preexec_fn is None and not pass_fds and gid is None and not gids and uid is None
                 and umask < 0 and all(r in (None, -1) for r in rest))
        # Inside a warm child only scripts (a benchmark's run.py): a `-c`/`-m` child of a warm
        # child may be a stand-in rank that must die with its parent, which a fork of the
        # server would not be.
        script = [a for a in argv or [] if a != UNBUFFERED]
        nested_ok = not _own_socket or (bool(script) and _warm_even_nested(script))
        sock = _server(full) if (argv and plain and nested_ok
                                 and full.get("MDK_TEST_COLD") != "1") else None
        conn = None
        if sock is not None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(sock)
            except OSError:  # that server is gone: start this one cold
                conn.close()
                conn = None
        if conn is None:
            return super()._execute_child(
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                restore_signals, gid, gids, uid, umask, start_new_session, *rest)
        req = {"argv": argv, "cwd": os.fspath(cwd or os.getcwd()), "env": full,
               "new_session": bool(start_new_session)}
        stdio = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                 errwrite if errwrite != -1 else 2]
        socket.send_fds(conn, [json.dumps(req).encode()], stdio)
        self._warm = conn
        self.pid = int(self._warm_line().removeprefix("P"))
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _warm_line(self) -> str:
        while b"\n" not in self._warm_buf:
            data = self._warm.recv(64)
            if not data:  # the waiter is gone without a word: report the child as killed
                return f"S{-signal.SIGKILL}"
            self._warm_buf += data
        line, self._warm_buf = self._warm_buf.split(b"\n", 1)
        return line.decode()

    def _warm_status(self) -> None:
        self.returncode = int(self._warm_line().removeprefix("S"))
        self._warm.close()

    def _internal_poll(self, _deadstate=None, *args, **kwargs):
        if self._warm is None:
            return super()._internal_poll(_deadstate, *args, **kwargs)
        if self.returncode is None and select.select([self._warm], [], [], 0)[0]:
            self._warm_status()
        return self.returncode

    def _wait(self, timeout):
        if self._warm is None:
            return super()._wait(timeout)
        if self.returncode is None:
            if not select.select([self._warm], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._warm_status()
        return self.returncode

