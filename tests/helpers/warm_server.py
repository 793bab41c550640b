"""The server side of tests/helpers/warm.py (its doc says what a warm start is and keeps): a
process that imported PRELOAD once and forks one child per request. Started by warm.py as
``python tests/helpers/warm_server.py serve <socket>``.

Protocol: the client sends one JSON request with three file descriptors (stdin, stdout, stderr)
over a Unix socket; the server forks a waiter, the waiter forks the child, replies ``P<pid>`` and, when the child ends,
``S<status>`` (negative: the signal), as ``Popen.returncode`` reads.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
import types
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path[0] = str(REPO)  # not tests/helpers: the children see the repository's modules only
# The server starts without PYTHONPATH (warm.APPLIED): a child's path is its own entries, then these.
BASE_PATH = sys.path[1:]

from launchers.bootstrap import add_plugin_path  # noqa: E402
from mdk.compose import compose  # noqa: E402
from mdk.stage import stage_names, stage_record  # noqa: E402
from tests.helpers import warm  # noqa: E402  # the client: a warm child's own commands use it
# What the server imports before it forks: what `run.py` and `python -m mdk.tools.*` load.
PRELOAD = ["torch", "torchvision", "hydra", "omegaconf", "launchers.hydra_app.cli",
           "launchers.hydra_app.entry", "launchers.processes.rank", "mdk.engine.runner"]
# Composed once before it forks (mdk's public compose: the suite's tiny presets, each stage's
# record), so a child finds what a first compose loads already loaded: Hydra's plugin scan, the
# modules it imports on first use. Nothing composed is kept: each compose of a child is Hydra's.
WARM_COMPOSES = [["debug=tiny"], ["debug=tiny_model"]]


def serve(sock_path: str) -> None:
    """Import PRELOAD, then fork one child per request until stdin closes (the test process
    that started this server ended)."""
    warm._own_socket = sock_path
    for name in PRELOAD:
        importlib.import_module(name)
    _compose_once()
    # What this server holds now lives as long as its children do: frozen, the collector of a
    # child never walks it. Else a child's first full collection reads all of it (~430k objects),
    # copying every page it shares with this server: 0.5 s of CPU in each command (Python's
    # gc.freeze documentation: for a parent that forks without exec).
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            os._exit(0)
        if listener in ready:
            conn, _ = listener.accept()
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            if os.fork() == 0:
                listener.close()
                _waiter(conn, json.loads(msg), fds)  # never returns
            conn.close()
            for fd in fds:
                os.close(fd)


def _compose_once() -> None:
    add_plugin_path()  # the plugin scan a compose starts sees our launchers, as run.py's does
    for overrides in WARM_COMPOSES:
        compose(overrides)
    for name in stage_names():
        stage_record(name)


def _waiter(conn: socket.socket, req: dict[str, Any], fds: list[int]) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(req, fds)  # never returns
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        conn.sendall(f"P{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        conn.sendall(f"S{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def _child(req: dict[str, Any], fds: list[int]) -> None:
    """Become ``python <argv>``: stdio, session, cwd, environment, signals, then run it."""
    code = 1
    try:
        if req["new_session"]:
            os.setsid()
        _place(fds, [0, 1, 2])
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        argv = list(req["argv"])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED")) or argv[0] == warm.UNBUFFERED
        if argv[0] == warm.UNBUFFERED:
            argv = argv[1:]
        sys.stdout.reconfigure(line_buffering=os.isatty(1), write_through=unbuffered)
        sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
        _apply(req["env"])
        # Its own `python run.py ...` commands (a benchmark's runs) come from this server too.
        warm._servers.clear()
        warm._servers[warm._server_key(req["env"])] = warm._own_socket
        subprocess.Popen = warm.Popen  # type: ignore[misc]
        os.execv = _exec_in_place  # type: ignore[assignment]
        code = _run(argv)
    except BaseException:  # noqa: BLE001 - the child's own report, as the interpreter's
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _apply(env: dict[str, str]) -> None:
    """What a fresh interpreter would have taken from warm.APPLIED's variables at its start."""
    # As python does: PYTHONPATH's entries after the script's folder, relative to the start's
    # folder ("" being that folder); unset or empty, none.
    entries = env.get("PYTHONPATH", "").split(os.pathsep) if env.get("PYTHONPATH") else []
    sys.path[1:] = [os.path.abspath(p or ".") for p in entries] + BASE_PATH
    libc = ctypes.CDLL(None)
    for name, param in warm.MALLOC_ENV.items():
        if env.get(name, "").isdigit():
            libc.mallopt(param, int(env[name]))
    if env.get(warm.THREADS):
        torch.set_num_threads(int(env[warm.THREADS]))


def _place(fds: list[int], targets: list[int]) -> None:
    """Put each received descriptor at its number (stdio)."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in fds]  # out of the targets' way
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets):
        os.dup2(fd, target)
        os.close(fd)


_COLD_EXECV = os.execv


def _exec_in_place(path: Any, args: Any) -> None:
    """``os.execv`` of this python with a script (mdk.tools.quant_report hands its process to
    run.py): the script runs here, warm, and the process ends with its status, as after an exec;
    anything else is a real exec."""
    argv = [os.fsdecode(a) for a in args]
    if os.fsdecode(path) != sys.executable or len(argv) < 2 or not argv[1].endswith(".py"):
        _COLD_EXECV(path, args)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    code = _run(argv[1:])
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _run(argv: list[str]) -> int:
    """Run ``argv`` (``script.py ...``, ``-m module ...`` or ``-c code ...``) as __main__ and end
    as the interpreter does: non-daemon threads joined, atexit handlers run, status returned."""
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv, sys.path[0] = list(argv), str(Path(argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = _exit_status(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _end(0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as python does: ended by SIGINT
    except BaseException:  # noqa: BLE001
        sys.excepthook(*sys.exc_info())
        code = 1
    return _end(code)


def _exit_status(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _end(code: int) -> int:
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own first step
    atexit._run_exitfuncs()
    return code


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2])
