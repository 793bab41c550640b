"""Start and stop a private single-node SLURM cluster (munge + slurmctld + slurmd) for the tests.

Everything SLURM writes (config, state, spool, pid and log files) lives in one temp dir and the
daemons find it through ``SLURM_CONF`` (nothing in /etc/slurm is touched). They listen on free
loopback ports, so a SLURM on the default ports 6817/6818 is left alone, and use a private munged.
Only daemons started here are stopped, by the pids in their own pid files. Background facts:
``/work/shared/notes/local-slurm.md``.

``start_cluster(..., hosts=create_hosts(...))`` makes a cluster of several nodes instead: one
slurmd per namespace host (``tests/netns_hosts.py``), each with its own node name, address, spool,
pid and log file (``%n`` in slurm.conf), and slurmctld on the hosts' bridge address.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from netns_hosts import HostSet
    from slurm_conf import write_config
except ImportError:
    from tests.netns_hosts import HostSet
    from tests.slurm_conf import write_config

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
SETUP_SCRIPT = REPO_ROOT / ".ci" / "slurm-setup.sh"
BINARIES = ("slurmctld", "slurmd", "sinfo", "sbatch", "srun", "squeue", "scancel", "scontrol",
            "munged", "munge", "unmunge", "mungekey")
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here (not root, binaries missing and not installable); tests should skip."""


def _which(name: str) -> str | None:
    # Daemons live in sbin, often not on a non-login PATH.
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS]))


def _bin(name: str) -> str:
    return _which(name) or name


def ensure_binaries() -> None:
    """Make sure the SLURM and munge binaries exist, installing them via .ci/slurm-setup.sh."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("not root: slurmd must run as root to launch jobs")
    if all(_which(b) for b in BINARIES):
        return
    if SETUP_SCRIPT.exists() and shutil.which("apt-get"):
        out = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=600)
        log.info("slurm-setup.sh: %s", out.stdout.strip().splitlines()[-1:] or out.stderr[-500:])
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        raise SlurmUnavailable(f"SLURM binaries missing: {', '.join(missing)} (run {SETUP_SCRIPT})")


def is_alive(pid: int) -> bool:
    """Whether PID is running, from /proc: ``kill -0`` also succeeds on an unreaped zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The command name is in parentheses and may contain spaces: the state follows the last ')'.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _read_pid(path: Path) -> int | None:
    text = path.read_text().split() if path.exists() else []
    return int(text[0]) if text and text[0].isdigit() else None


def _tail(path: Path, n: int = 30) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@dataclass
class SlurmCluster:
    """A running private cluster. ``env`` is what subprocesses need to talk to it."""

    tmpdir: Path
    conf: Path
    munge_dir: Path
    partition: str = "debug"
    env: dict[str, str] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=lambda: ["localhost"])
    started_pids: dict[str, int] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM client command (``sinfo``, ``sbatch`` ...) against this cluster.

        With ``check`` a failure raises RuntimeError carrying the command's stderr.
        """
        res = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def logs(self, n: int = 30) -> str:
        """Tails of the daemon logs, for error messages."""
        files = [self.tmpdir / "slurmctld.log", *(self.tmpdir / f"slurmd-{x}.log" for x in self.nodes)]
        return "\n".join(f"--- {p.name} ---\n{_tail(p, n)}" for p in files)

    def job_ids(self) -> list[str]:
        """Ids of the jobs still queued or running."""
        return self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()

    def job_state(self, job_id: str) -> str:
        """SLURM state of a job (PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...), '' if unknown.

        With no accounting, sacct (and so submitit's job.state) cannot tell; squeue keeps finished
        jobs for MinJobAge (300 s).
        """
        out = self.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False).stdout
        return out.strip()

    def stop(self, timeout: float = 15) -> None:
        """Cancel every job, then stop the daemons this object started (slurmd first)."""
        if "slurmctld" in self.started_pids and is_alive(self.started_pids["slurmctld"]):
            ids = self.job_ids()
            if ids:
                self.run("scancel", *ids, check=False)
                deadline = time.monotonic() + timeout
                while self.job_ids() and time.monotonic() < deadline:
                    time.sleep(0.5)
        slurmds = [k for k in self.started_pids if k.startswith("slurmd@")]
        for name in (*slurmds, "slurmctld", "munged"):
            pid = self.started_pids.pop(name, None)
            if pid is not None:
                _terminate(name.split("@")[0], pid, timeout)
        shutil.rmtree(self.munge_dir, ignore_errors=True)


def _terminate(name: str, pid: int, timeout: float) -> None:
    """SIGTERM then (after ``timeout``) SIGKILL; a zombie counts as stopped.

    A pid whose /proc comm is no longer ``name`` (the daemon died, the pid was reused) is left alone.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        comm = Path(f"/proc/{pid}/comm")
        if not is_alive(pid) or not comm.exists() or comm.read_text().strip() != name[:15]:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    if is_alive(pid):
        log.warning("%s (pid %d) did not stop", name, pid)


def _munge_works(socket_path: Path) -> bool:
    sock = f"--socket={socket_path}"
    munge = subprocess.run([_bin("munge"), "-n", sock], capture_output=True, timeout=10)
    if munge.returncode != 0:
        return False
    return subprocess.run([_bin("unmunge"), sock], input=munge.stdout, capture_output=True,
                          timeout=10).returncode == 0


def _start_munge(cluster: SlurmCluster) -> None:
    """Start a private munged (own key, socket, pid file) that only this cluster uses.

    Sharing the system munged would let one test session's teardown cut off another session's
    cluster (engineers run the suite concurrently). munged refuses to run as root, so it runs as
    the ``munge`` user in a short /tmp dir it owns (socket paths are limited to ~100 chars).
    """
    d = cluster.munge_dir
    shutil.chown(d, "munge", "munge")
    d.chmod(0o755)  # munged requires the socket dir to be searchable by all
    as_munge = ["runuser", "-u", "munge", "--"]
    key = subprocess.run([*as_munge, _bin("mungekey"), "--create", f"--keyfile={d / 'munge.key'}"],
                         capture_output=True, text=True, timeout=30)
    if key.returncode != 0:
        raise RuntimeError(f"mungekey failed: {key.stderr.strip()}")
    sock = d / "munge.socket"
    res = subprocess.run([*as_munge, _bin("munged"), f"--socket={sock}",
                          f"--key-file={d / 'munge.key'}", f"--log-file={d / 'munged.log'}",
                          f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}"],
                         capture_output=True, text=True, timeout=30)
    deadline = time.monotonic() + 10
    while not _munge_works(sock):
        if time.monotonic() > deadline:
            raise RuntimeError(f"munged did not start (exit {res.returncode}): {res.stderr.strip()}\n"
                               + _tail(d / "munged.log"))
        time.sleep(0.1)
    pid = _read_pid(d / "munged.pid")
    if pid is not None:
        cluster.started_pids["munged"] = pid


def _start_daemon(cluster: SlurmCluster, name: str, argv: list[str], pidfile: Path) -> None:
    """Run ``argv`` (a daemon that forks) and record the pid from its pid file as ``name``."""
    res = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=60)
    deadline = time.monotonic() + 10
    pid = _read_pid(pidfile)
    while (pid is None or not is_alive(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
        pid = _read_pid(pidfile)
    if pid is None or not is_alive(pid):
        raise RuntimeError(f"{name} did not start (exit {res.returncode}): {res.stderr.strip()}\n"
                           + cluster.logs())
    cluster.started_pids[name] = pid


def _wait_idle(cluster: SlurmCluster, timeout: float) -> None:
    deadline, state = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        res = cluster.run("sinfo", "-h", "-N", "-p", cluster.partition, "-o", "%t", check=False)
        state = res.stdout.strip() or res.stderr.strip()
        if res.stdout.split() == ["idle"] * len(cluster.nodes):
            return
        time.sleep(0.3)
    raise RuntimeError(f"nodes not idle after {timeout:.0f} s (sinfo: {state!r})\n" + cluster.logs())


def start_cluster(tmpdir: Path, partition: str = "debug", timeout: float = 30,
                  hosts: HostSet | None = None) -> SlurmCluster:
    """Start a private munged, slurmctld and slurmd; return once ``sinfo`` shows the node idle.

    With ``hosts`` (namespace hosts, ``tests/netns_hosts.py``): one slurmd per host, slurmctld
    on the hosts' bridge address, return once every node is idle.

    Raises SlurmUnavailable when this machine cannot run SLURM at all, RuntimeError (with the
    daemon log tails) when the daemons fail to come up. On failure, what was started is stopped.
    """
    ensure_binaries()
    tmpdir = Path(tmpdir)
    munge_dir = Path(tempfile.mkdtemp(prefix="mdk-munge-", dir="/tmp"))
    nodes = [(n, hosts.addr(i)) for i, n in enumerate(hosts.names)] if hosts else [("localhost", "127.0.0.1")]
    conf = write_config(_bin("slurmd"), tmpdir, munge_dir / "munge.socket", partition, nodes,
                        hosts.controller if hosts else None)
    env = dict(os.environ, SLURM_CONF=str(conf))
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), *SBIN_DIRS])
    cluster = SlurmCluster(tmpdir, conf, munge_dir, partition, env, [n for n, _ in nodes])
    try:
        _start_munge(cluster)
        # -c: fresh state
        _start_daemon(cluster, "slurmctld", [_bin("slurmctld"), "-c"], tmpdir / "slurmctld.pid")
        for i, (name, _) in enumerate(nodes):
            argv = [_bin("slurmd"), "-N", name]
            if hosts:  # the munge socket and SLURM_CONF are files: reachable from every namespace
                argv = hosts.prefix(i, " ".join(argv))
            _start_daemon(cluster, f"slurmd@{name}", argv, tmpdir / f"slurmd-{name}.pid")
        _wait_idle(cluster, timeout)
    except BaseException:
        cluster.stop()
        raise
    log.info("SLURM cluster up in %s (pids %s)", tmpdir, cluster.started_pids)
    return cluster
