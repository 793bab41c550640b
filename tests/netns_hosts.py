"""Several "hosts" on this one machine: network namespaces joined by veth pairs on a private bridge.

Host i is a network namespace whose only interfaces are loopback and ``eth0`` (one end of a veth
pair, the other end on a bridge in the root namespace), with an address in a private /24 that is
not in use here (10.213.N.0/24). The bridge holds ``.1``, host i ``.(10+i)``; no default route,
so nothing leaves the subnet (no real network). A process started with ``HostSet.prefix(i)``
also gets its own UTS namespace (hostname ``node<i>``) and a private mount namespace in which
``/etc/hosts`` is a file of this set (``node0``/``node1``/``mdkctl`` to their addresses), as on a
cluster where node names resolve. Nothing under /etc is written.

Why ``nsenter --net`` and not ``ip netns exec``: the latter mounts a fresh sysfs, which hides
``/sys/fs/cgroup``, and slurmd then stops with "No filesystem mounted on /sys/fs/cgroup /
Unable to initialize cgroup plugin" (Slurm 22.05, measured here).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

TOOLS = ("ip", "nsenter", "unshare", "mount")


class NamespacesUnavailable(RuntimeError):
    """This machine cannot make network namespaces here (not root, tools or CAP_NET_ADMIN missing)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([shutil.which("ip") or "ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {res.stderr.strip()}")
    return res


@dataclass
class HostSet:
    """Hosts ``node0`` .. ``node<n-1>`` in namespaces; ``controller`` is the bridge address."""

    tag: str
    subnet: str                      # "10.213.N"
    tmpdir: Path
    names: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"mdkbr{self.tag}"

    @property
    def controller(self) -> str:
        return f"{self.subnet}.1"

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def hosts_file(self, i: int) -> Path:
        return self.tmpdir / f"hosts-{self.names[i]}"

    def prefix(self, i: int, command: str) -> list[str]:
        """argv running the shell ``command`` on host i (its network, hostname and /etc/hosts)."""
        inner = (f"mount --bind {self.hosts_file(i)} /etc/hosts && hostname {self.names[i]} && "
                 f"exec {command}")
        return ["nsenter", f"--net=/run/netns/{self.namespaces[i]}", "unshare", "--mount",
                "--uts", "--propagation", "private", "sh", "-c", inner]

    def remove(self) -> None:
        """Delete the namespaces (their veth ends go with them) and the bridge."""
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)


def check_possible() -> None:
    """Raise NamespacesUnavailable with the reason when namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise NamespacesUnavailable("not root: creating network namespaces needs root (CAP_NET_ADMIN)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise NamespacesUnavailable(f"missing {', '.join(missing)} (Debian: apt-get install iproute2 "
                                    "util-linux mount; .ci/slurm-setup.sh does it)")
    probe = f"mdkprobe{os.getpid()}"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        raise NamespacesUnavailable(f"`ip netns add` failed: {res.stderr.strip()} (no CAP_NET_ADMIN "
                                    "in this container?)")
    _ip("netns", "del", probe, check=False)


def _free_subnet() -> str:
    """A 10.213.N /24 that no address or route of this machine uses."""
    used = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
    links, spaces = _ip("-o", "link").stdout, _ip("netns", "list").stdout.split()
    start = os.getpid() % 200
    for k in range(200):
        n = 20 + (start + k) % 200  # names and addresses of a leftover set are skipped too
        if f"10.213.{n}." not in used and f" mdkbr{n}:" not in links and f"mdk{n}n0" not in spaces:
            return f"10.213.{n}"
    raise RuntimeError("no free 10.213.N.0/24 subnet")


def create_hosts(tmpdir: Path, n: int = 2) -> HostSet:
    """Make ``n`` namespace hosts on a fresh bridge; on failure what was made is removed."""
    check_possible()
    subnet = _free_subnet()
    tag = subnet.rsplit(".", 1)[1]
    hs = HostSet(tag, subnet, Path(tmpdir))
    hs.tmpdir.mkdir(parents=True, exist_ok=True)
    try:
        _ip("link", "add", hs.bridge, "type", "bridge")
        _ip("addr", "add", f"{hs.controller}/24", "dev", hs.bridge)
        _ip("link", "set", hs.bridge, "up")
        for i in range(n):
            ns, veth = f"mdk{tag}n{i}", f"mdk{tag}v{i}"
            hs.names.append(f"node{i}")
            _ip("netns", "add", ns)
            hs.namespaces.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", hs.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{hs.addr(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        table = ["127.0.0.1 localhost", f"{hs.controller} mdkctl"]
        table += [f"{hs.addr(i)} {name}" for i, name in enumerate(hs.names)]
        for i in range(n):
            hs.hosts_file(i).write_text("\n".join(table) + "\n")
    except BaseException:
        hs.remove()
        raise
    log.info("namespace hosts %s on %s.0/24 (bridge %s)", hs.names, subnet, hs.bridge)
    return hs


PROBE = """import socket, sys, time
host, port, role, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
if role == "listen":
    s = socket.socket(); s.bind(("0.0.0.0", port)); s.listen(); s.settimeout(timeout)
    c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.close()
else:
    end = time.monotonic() + timeout
    while True:
        try:
            print(socket.create_connection((host, port), 1).recv(100).decode()); break
        except OSError:
            if time.monotonic() > end: raise
            time.sleep(0.1)
"""


def hostname_via_tcp(hs: HostSet, src: int, dst: int, port: int = 5000, timeout: float = 20) -> str:
    """From host ``src``, connect to host ``dst`` by its name and return the hostname it sends."""
    script = hs.tmpdir / "probe.py"
    script.write_text(PROBE)
    server = subprocess.Popen(hs.prefix(dst, f"python3 {script} - {port} listen {timeout}"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        res = subprocess.run(hs.prefix(src, f"python3 {script} {hs.names[dst]} {port} connect {timeout}"),
                             capture_output=True, text=True, timeout=timeout + 10)
        return res.stdout.strip() or res.stderr.strip()[-300:]
    finally:
        server.kill()
        server.wait()
