"""The server side of tests/helpers/warm.py (its doc says what a warm start is and keeps): a
process that imported PRELOAD once and forks one child per request. Started by warm.py as
``python tests/helpers/warm_server.py serve <socket>``.

Protocol: the client sends one JSON request with three file descriptors (stdin, stdout, stderr)
over a Unix socket; the server forks a waiter, the waiter forks the child, replies ``P<pid>``
and, when the child ends, ``S<status>`` (negative: the signal), as ``Popen.returncode`` reads.
"""
from __future__ import annotations

import atexit
import contextlib
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

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path[0] = str(REPO)  # not tests/helpers: the children see the repository's modules only

from tests.helpers import warm  # noqa: E402  # the client: a warm child's own commands use it

# What the server imports before it forks: what `run.py` and `python -m mdk.tools.*` load.
PRELOAD = ["torch", "torchvision", "hydra", "omegaconf", "launchers.hydra_app.cli",
           "launchers.hydra_app.entry", "launchers.processes.rank", "mdk.engine.runner"]


def serve(sock_path: str) -> None:
    """Import PRELOAD, then fork one child per request until stdin closes (the test process
    that started this server ended)."""
    warm._own_socket = sock_path
    for name in PRELOAD:
        importlib.import_module(name)
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
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdout.reconfigure(line_buffering=os.isatty(1), write_through=unbuffered)
        sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
        if req["env"].get(warm.THREADS):
            import torch  # preloaded: a name lookup

            torch.set_num_threads(int(req["env"][warm.THREADS]))
        # Its own `python run.py ...` commands (a benchmark's runs) come from this server too.
        warm._servers.clear()
        warm._servers[warm._server_key(req["env"])] = warm._own_socket
        subprocess.Popen = warm.Popen  # type: ignore[misc]
        code = _run(req["argv"])
    except BaseException:  # noqa: BLE001 - the child's own report, as the interpreter's
        traceback.print_exc()
    finally:
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
