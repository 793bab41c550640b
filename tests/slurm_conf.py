"""slurm.conf for the test clusters (``tests/slurm_cluster.py``): everything in one temp dir."""
from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path
from typing import Sequence


def free_port() -> int:
    """A TCP port that is free on loopback right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_line(slurmd: str, name: str = "localhost", addr: str = "127.0.0.1") -> str:
    """NodeName line for one node with the CPUs/memory ``slurmd -C`` detects on this machine."""
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, timeout=30).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", out))
    keep = ["CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory"]
    hw = " ".join(f"{k}={fields[k]}" for k in keep if k in fields)
    if "CPUs" not in fields:
        raise RuntimeError(f"`slurmd -C` gave no CPUs: {out!r}")
    return f"NodeName={name} NodeAddr={addr} {hw} State=UNKNOWN"


def write_config(slurmd: str, tmpdir: Path, munge_socket: Path, partition: str = "debug",
                 nodes: Sequence[tuple[str, str]] = (("localhost", "127.0.0.1"),),
                 controller: str | None = None) -> Path:
    """Write slurm.conf into ``tmpdir``; return its path.

    ``nodes``: (name, address) of each slurmd; ``controller``: the address they reach slurmctld
    at (default: loopback, for the single localhost node)."""
    (tmpdir / "state").mkdir(parents=True, exist_ok=True)
    for name, _ in nodes:
        (tmpdir / f"spool-{name}").mkdir(parents=True, exist_ok=True)  # slurmd does not create it
    conf = tmpdir / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=mdktest",
        f"SlurmctldHost=localhost({controller})" if controller else "SlurmctldHost=localhost",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
        f"AuthInfo=socket={munge_socket},cred_expire=5",
        f"StateSaveLocation={tmpdir / 'state'}",
        # %n: the node name, so that several slurmd on one machine keep apart
        f"SlurmdSpoolDir={tmpdir / 'spool-%n'}",
        f"SlurmctldPidFile={tmpdir / 'slurmctld.pid'}",
        f"SlurmdPidFile={tmpdir / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={tmpdir / 'slurmctld.log'}",
        f"SlurmdLogFile={tmpdir / 'slurmd-%n.log'}",
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
        *(node_line(slurmd, name, addr) for name, addr in nodes),
        f"PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    return conf
