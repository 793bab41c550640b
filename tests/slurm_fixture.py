"""pytest plugin: the session-scoped ``slurm_cluster`` fixture (list it in conftest ``pytest_plugins``).

The cluster starts once per session, on first use, and is stopped at the end. Where SLURM cannot
run (not root, no apt to install it) the tests that use it skip with the reason; set
``MDK_REQUIRE_SLURM=1`` (CI) to turn that skip into an error so a broken setup cannot hide.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from netns_hosts import HostSet, NamespacesUnavailable, create_hosts
    from slurm_cluster import SlurmCluster, SlurmUnavailable, start_cluster
except ImportError:  # loaded as tests.slurm_fixture (e.g. `-p tests.slurm_fixture`)
    from tests.netns_hosts import HostSet, NamespacesUnavailable, create_hosts
    from tests.slurm_cluster import SlurmCluster, SlurmUnavailable, start_cluster

REQUIRE_ENV = "MDK_REQUIRE_SLURM"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running single-node cluster; ``os.environ['SLURM_CONF']`` points at it meanwhile.

    SLURM_CONF is also exported into this process because submitit and Hydra's launcher call
    ``sbatch`` with the test process's own environment.
    """
    yield from _cluster(tmp_path_factory.mktemp("slurm"))


@pytest.fixture(scope="module")
def namespace_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostSet]:
    """Two hosts, ``node0`` and ``node1``, each a network namespace (``tests/netns_hosts.py``).

    Skips with the reason where namespaces cannot be made (not root, no ``ip``, no
    CAP_NET_ADMIN), even under MDK_REQUIRE_SLURM: that needs more than SLURM does."""
    try:
        hosts = create_hosts(tmp_path_factory.mktemp("hosts"))
    except NamespacesUnavailable as exc:
        pytest.skip(f"cannot make network namespace hosts here: {exc}")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"could not make network namespace hosts: {exc}")
    try:
        yield hosts
    finally:
        hosts.remove()


@pytest.fixture(scope="module")
def slurm_two_nodes(namespace_hosts: HostSet,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running cluster whose two nodes are the namespace hosts (one slurmd in each, slurmctld
    on the bridge); ``os.environ['SLURM_CONF']`` points at it meanwhile."""
    yield from _cluster(tmp_path_factory.mktemp("slurm2"), hosts=namespace_hosts)


def _cluster(tmpdir: Path, **kwargs) -> Iterator[SlurmCluster]:
    required = os.environ.get(REQUIRE_ENV, "") not in ("", "0")
    try:
        cluster = start_cluster(tmpdir, **kwargs)
    except SlurmUnavailable as exc:
        if required:
            pytest.fail(f"{REQUIRE_ENV} is set but SLURM cannot run here: {exc}")
        pytest.skip(f"SLURM unavailable: {exc}")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        if required:
            raise
        pytest.skip(f"SLURM did not start: {exc}")
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PATH")}
    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    os.environ["PATH"] = cluster.env["PATH"]
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cluster.stop()


def wait_for(predicate, timeout: float, what: str, cluster: SlurmCluster | None = None,
             interval: float = 0.2) -> None:
    """Poll ``predicate`` until true; on timeout fail naming ``what`` (plus queue and logs).

    Tests poll with their own bound instead of ``sbatch --wait`` (10 s polls) or submitit's
    ``job.result()``, which can wait forever for a cancelled job when there is no accounting.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    detail = ""
    if cluster is not None:
        detail = "\nsqueue:\n" + cluster.run("squeue", check=False).stdout + cluster.logs(15)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{detail}")


def read_text(path: Path) -> str:
    """File content, or '' while it does not exist yet (job output appears asynchronously)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
