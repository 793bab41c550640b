"""multiprocessing's forkserver, started warm for the suite's multi-rank commands.

A ``dist.gpus=2`` command launches its ranks from a forkserver (launchers/processes/spawn.py):
multiprocessing starts it as ``python -c 'from multiprocessing.forkserver import main; ...'`` with
two descriptors (its listening socket and the "alive" pipe), and that fresh interpreter spends
~6 s of CPU importing torch and mdk before it forks the first rank. In a warm child (a command
forked by tests/helpers/warm_server.py) ``install`` has multiprocessing start this small script
instead: it hands the ``-c`` code, the two descriptors at their numbers, stdio and the environment
to the same warm server, which forks a child that runs the code as a fresh interpreter would.

What the launcher sees stays a forkserver's: its own child (this script: ``waitpid`` works, it is
in the command's process group), alive while the real one is, ending with its status; the
signals a terminal or a test sends it are passed on. The forkserver itself ends when the alive
pipe closes, as before. Where the server cannot take it (gone, or another start-up environment)
this script becomes the cold forkserver (``exec``), so a command never depends on the warm path.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from typing import Any, Callable, Optional

import multiprocessing.util as mp_util

CODE_START = "from multiprocessing.forkserver import main"
FORWARD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
           signal.SIGQUIT)


def install(sock_path: str, server_for: Callable[[dict], Optional[str]]) -> None:
    """In a warm child: start multiprocessing's forkserver from the server at ``sock_path`` while
    ``server_for(environment)`` (warm.py's choice of server) still names it."""
    cold = mp_util.spawnv_passfds

    def spawnv_passfds(path: str, args: list[str], passfds: Any) -> int:
        # Its interpreter flags come from the start-up environment this process shares with the
        # server (a command with flags of its own starts cold and has no warm children).
        env = dict(os.environ)
        if (env.get("MDK_TEST_COLD") == "1" or server_for(env) != sock_path or len(args) < 3
                or args[-2] != "-c" or not args[-1].startswith(CODE_START)):
            return cold(path, args, passfds)
        fds = sorted(map(int, passfds))
        proxy = [sys.executable, "-I", "-S", os.path.abspath(__file__), sock_path,
                 json.dumps(fds), *args]
        return cold(os.fsencode(sys.executable), proxy, fds)

    mp_util.spawnv_passfds = spawnv_passfds


def main(sock_path: str, fds: list[int], cold_args: list[str]) -> None:
    """Have the server fork the forkserver; wait for it, passing signals on; end as it ended."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
    except OSError:  # no server: be the forkserver multiprocessing asked for
        os.execv(cold_args[0], cold_args)
    req = {"argv": ["-c", cold_args[-1]], "cwd": os.getcwd(), "env": dict(os.environ),
           "new_session": False, "pass_fds": fds}
    socket.send_fds(conn, [json.dumps(req).encode()], [0, 1, 2, *fds])
    for fd in fds:  # the forkserver holds them now
        os.close(fd)
    child: Optional[int] = None
    pending: list[int] = []

    def forward(sig: int, _frame: Any) -> None:
        if child is None:
            pending.append(sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)

    for s in FORWARD:
        signal.signal(s, forward)
    lines = _lines(conn)
    child = int(next(lines, "P0").removeprefix("P")) or None
    for sig in pending:
        forward(sig, None)
    status = int(next(lines, f"S{-signal.SIGKILL}").removeprefix("S"))
    if status < 0:  # ended by a signal: so does this stand-in
        for s in FORWARD:
            signal.signal(s, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


def _lines(conn: socket.socket):
    buf = b""
    while True:
        while b"\n" not in buf:
            try:
                data = conn.recv(64)
            except InterruptedError:
                continue
            if not data:
                return
            buf += data
        line, buf = buf.split(b"\n", 1)
        yield line.decode()


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:])
