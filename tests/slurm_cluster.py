"""Start and stop a private single-node SLURM cluster (munge + slurmctld + slurmd) for the tests.

Everything SLURM writes (config, state, spool, pid and log files) lives in one temp dir and the
daemons find it through ``SLURM_CONF`` (nothing in /etc/slurm is touched). They listen on free
loopback ports, so a SLURM on the default ports 6817/6818 is left alone, and use a private munged.
Only daemons started here are stopped, by the pids in their own pid files. Background facts:
``/work/shared/notes/local-slurm.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

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


def free_port() -> int:
    """A TCP port that is free on loopback right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _node_line() -> str:
    """NodeName line for localhost with the CPUs/memory ``slurmd -C`` detects on this machine."""
    out = subprocess.run([_bin("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", out))
    keep = ["CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory"]
    hw = " ".join(f"{k}={fields[k]}" for k in keep if k in fields)
    if "CPUs" not in fields:
        raise SlurmUnavailable(f"`slurmd -C` gave no CPUs: {out!r}")
    return f"NodeName=localhost NodeAddr=127.0.0.1 {hw} State=UNKNOWN"


@dataclass
class SlurmCluster:
    """A running private cluster. ``env`` is what subprocesses need to talk to it."""

    tmpdir: Path
    conf: Path
    munge_dir: Path
    partition: str = "debug"
    env: dict[str, str] = field(default_factory=dict)
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
        return "\n".join(f"--- {p.name} ---\n{_tail(p, n)}"
                         for p in (self.tmpdir / "slurmctld.log", self.tmpdir / "slurmd.log"))

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
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.started_pids.pop(name, None)
            if pid is not None:
                _terminate(name, pid, timeout)
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


def write_config(tmpdir: Path, munge_socket: Path, partition: str = "debug") -> Path:
    """Write slurm.conf into ``tmpdir``; return its path."""
    for sub in ("state", "spool"):
        (tmpdir / sub).mkdir(parents=True, exist_ok=True)  # slurmd does not create its spool dir
    conf = tmpdir / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=mdktest",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
        f"AuthInfo=socket={munge_socket},cred_expire=5",
        f"StateSaveLocation={tmpdir / 'state'}",
        f"SlurmdSpoolDir={tmpdir / 'spool'}",
        f"SlurmctldPidFile={tmpdir / 'slurmctld.pid'}",
        f"SlurmdPidFile={tmpdir / 'slurmd.pid'}",
        f"SlurmctldLogFile={tmpdir / 'slurmctld.log'}",
        f"SlurmdLogFile={tmpdir / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",  # no cgroups in containers
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobRequeue=1",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=1",  # start pending jobs within ~1 s
        "KillWait=5",
        _node_line(),
        f"PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    return conf


def _start_daemon(cluster: SlurmCluster, name: str, args: list[str], pidfile: Path) -> None:
    res = subprocess.run([_bin(name), *args], env=cluster.env, capture_output=True, text=True, timeout=60)
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
        if state == "idle":
            return
        time.sleep(0.3)
    raise RuntimeError(f"node not idle after {timeout:.0f} s (sinfo: {state!r})\n" + cluster.logs())


def start_cluster(tmpdir: Path, partition: str = "debug", timeout: float = 30) -> SlurmCluster:
    """Start a private munged, slurmctld and slurmd; return once ``sinfo`` shows the node idle.

    Raises SlurmUnavailable when this machine cannot run SLURM at all, RuntimeError (with the
    daemon log tails) when the daemons fail to come up. On failure, what was started is stopped.
    """
    ensure_binaries()
    tmpdir = Path(tmpdir)
    munge_dir = Path(tempfile.mkdtemp(prefix="mdk-munge-", dir="/tmp"))
    conf = write_config(tmpdir, munge_dir / "munge.socket", partition)
    env = dict(os.environ, SLURM_CONF=str(conf))
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), *SBIN_DIRS])
    cluster = SlurmCluster(tmpdir, conf, munge_dir, partition, env)
    try:
        _start_munge(cluster)
        _start_daemon(cluster, "slurmctld", ["-c"], tmpdir / "slurmctld.pid")  # -c: fresh state
        _start_daemon(cluster, "slurmd", ["-N", "localhost"], tmpdir / "slurmd.pid")
        _wait_idle(cluster, timeout)
    except BaseException:
        cluster.stop()
        raise
    log.info("SLURM cluster up in %s (pids %s)", tmpdir, cluster.started_pids)
    return cluster
