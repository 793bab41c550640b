"""How the ranks of a run find each other: a TCP key-value store at ``dist.dist_url``.

Why not ``init_method="tcp://host:port"``: there rank 0 binds the port inside a worker, so a port
picked by "find a free port, close it, hand it on" can be taken by another run in between, and a
rank that cannot reach the address just hangs or fails with a bare gloo message. Here

* on one machine the *parent* process opens the store on port 0 (the OS picks a free port and
  keeps it for the whole run), so two runs started at once can never collide;
* every rank checks in under ``<prefix>/arrived/<rank>`` before the process group is built, so
  a timeout names the address, the ranks that arrived and what to check.
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import os
import socket
import struct
import time
from datetime import timedelta
from typing import Optional

import torch.distributed as tdist

from mdk.dist_config import parse_dist_url
from mdk.errors import UserError

log = logging.getLogger(__name__)

HINT = ("check that machine 0 (dist.rank=0) is running, that every machine uses the same "
        "dist.dist_url / dist.nodes / dist.gpus, and that the port is reachable from every "
        "machine (firewall, VPN, a cluster network interface that is not the default one)")


class RendezvousError(UserError, RuntimeError):
    """The ranks of a run could not meet; the message says where and what to check."""

    label = "distributed setup error"


def port_is_free(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def host_store(url: str, nodes: int, timeout_s: float) -> tuple[tdist.TCPStore, str, int]:
    """Open the run's store on this machine (machine 0); returns (store, address, port).

    One machine: ``auto`` or a busy port means port 0, i.e. a free port the OS keeps reserved for
    us. Several machines: the others were told the port, so a busy port is an error naming it."""
    timeout = timedelta(seconds=timeout_s)
    if str(url) == "auto":
        host, port = "127.0.0.1", 0
    else:
        host, port = parse_dist_url(url)
        if nodes == 1 and not port_is_free(port):
            log.warning("dist.dist_url=%s: port %d is in use; using a free port instead (one "
                        "machine, so nobody else needs to know it)", url, port)
            host, port = "127.0.0.1", 0
    try:
        store = tdist.TCPStore(host, port, None, True, timeout, wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        busy = "in use" in str(e).lower() or getattr(e, "errno", None) == errno.EADDRINUSE
        why = "the port is already in use (another run, or a leftover process)" if busy else str(e)
        raise RendezvousError(
            f"cannot open the rendezvous at dist.dist_url={host}:{port} on machine 0: {why}. Pick "
            f"another port and give the same dist.dist_url=HOST:PORT on every machine") from e
    return store, host, store.port


def connect(host: str, port: int, timeout_s: float) -> tdist.TCPStore:
    """A client of the store at host:port, or RendezvousError naming it after ``timeout_s``."""
    t0 = time.monotonic()
    try:
        return tdist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s),
                              wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        raise RendezvousError(
            f"could not reach the rendezvous at dist.dist_url={host}:{port} within "
            f"{time.monotonic() - t0:.0f}s (dist.timeout_s={timeout_s:g}): nothing answered. "
            f"{HINT[0].upper() + HINT[1:]}. ({type(e).__name__}: {str(e).splitlines()[0]})") from e


def check_in(store: tdist.Store, prefix: str, rank: int, world: int, timeout_s: float,
             where: str, poll_s: float = 0.05) -> None:
    """Register ``rank`` and wait for all ``world`` ranks; on timeout list who came."""
    store.set(f"{prefix}/arrived/{rank}", socket.gethostname())
    store.add(f"{prefix}/count", 1)
    deadline = time.monotonic() + timeout_s
    while store.add(f"{prefix}/count", 0) < world:
        if time.monotonic() > deadline:
            arrived = [r for r in range(world) if store.check([f"{prefix}/arrived/{r}"])]
            hosts = {r: store.get(f"{prefix}/arrived/{r}").decode() for r in arrived}
            missing = [r for r in range(world) if r not in arrived]
            raise RendezvousError(
                f"rank {rank}: timed out after {timeout_s:g}s (dist.timeout_s) waiting at "
                f"dist.dist_url={where}: {len(arrived)} of {world} ranks arrived "
                f"({', '.join(f'{r}@{h}' for r, h in hosts.items())}); missing ranks {missing}. "
                f"{HINT[0].upper() + HINT[1:]}")
        time.sleep(poll_s)


def interface_towards(host: str, port: int) -> Optional[str]:
    """The name of this machine's network interface that packets to host:port leave through.

    None when it cannot be told (unresolvable host, a loopback route, not Linux)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))  # UDP: picks the route, sends nothing
            local = s.getsockname()[0]
        if ipaddress.ip_address(local).is_loopback:
            return None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:  # SIOCGIFADDR: the interface's IPv4 address
                    raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue
                if socket.inet_ntoa(raw[20:24]) == local:
                    return name
    except (OSError, ValueError):
        return None
    return None


def init_group(backend: str, rank: int, world: int, host: str, port: int, timeout_s: float,
               prefix: str, store: Optional[tdist.Store] = None) -> None:
    """Meet the other ranks at host:port and build the default process group."""
    if store is None:
        store = connect(host, port, timeout_s)
    check_in(store, prefix, rank, world, timeout_s, f"{host}:{port}")
    # gloo binds to the address this machine's hostname resolves to, and falls back to loopback
    # when that address cannot be bound (hostname mapped to 127.0.1.1, a node whose name is only
    # known to the scheduler); peers on other machines then dial 127.0.0.1 and are refused. Bind
    # to the interface that reaches the rendezvous instead, unless the user chose one.
    iface = None
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        iface = interface_towards(host, port)
    if iface:
        log.debug("rank %d: gloo on interface %s (the route to %s)", rank, iface, host)
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    try:
        tdist.init_process_group(backend, store=tdist.PrefixStore(f"{prefix}/pg", store),
                                 rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    finally:
        if iface:  # read when the group is made; not left behind for later groups
            del os.environ["GLOO_SOCKET_IFNAME"]
