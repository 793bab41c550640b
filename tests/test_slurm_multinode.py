"""Training on two machines through SLURM, for real: a cluster of two nodes on this one machine.

Each node is a network namespace host (``tests/netns_hosts.py``: own interface and address on a
private bridge, own hostname, loopback otherwise) with its own slurmd; one slurmctld schedules
both. ``python run.py -m hydra/launcher=submitit_slurm dist.nodes=2`` then runs one task on each
node, the tasks meet over the bridge at node0 (gloo on CPU) and train one model. In exact mode
(``dist.exact_chunk``, one CPU thread, no BatchNorm: docs/distributed.md) that model has the
same bits as the same run on one process.

The fixtures skip with the reason where namespaces cannot be made (not root, no ``ip``, no
CAP_NET_ADMIN) or SLURM cannot run.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import REPO, TINY, compose
from netns_hosts import hostname_via_tcp

pytestmark = pytest.mark.slurm
EXACT = ["model.net.batch_norm=false", "dist.exact_chunk=2", "dist.cpu_threads=1"]


def test_namespace_hosts_have_own_names_and_reach_each_other(namespace_hosts):
    hs = namespace_hosts
    assert hs.names == ["node0", "node1"]
    # node1 connects to node0 by name over the bridge; the listener answers with its hostname
    assert hostname_via_tcp(hs, src=1, dst=0) == "node0"
    assert hostname_via_tcp(hs, src=0, dst=1, port=5001) == "node1"
    addrs = subprocess.run(hs.prefix(0, "ip -4 -o addr"), capture_output=True, text=True).stdout
    assert re.findall(r"inet (\S+)", addrs) == ["127.0.0.1/8", f"{hs.addr(0)}/24"]  # nothing else
    # gloo is bound to the interface that reaches the rendezvous host, on either side of it
    probe = (f"{sys.executable} -c 'import sys; sys.path.insert(0, \"{REPO}\"); "
             "from launchers.processes.join import interface_towards as f; "
             "print(f(\"node0\", 29500))'")
    for i in (0, 1):
        res = subprocess.run(hs.prefix(i, probe), capture_output=True, text=True, timeout=60)
        assert res.stdout.strip() == "eth0", res.stderr[-500:]


def test_srun_runs_one_task_on_each_node(slurm_two_nodes):
    res = slurm_two_nodes.run("srun", "-N", "2", "-n", "2", "bash", "-c",
                              "echo $SLURM_PROCID $(hostname) $SLURM_JOB_NODELIST", timeout=60)
    assert sorted(res.stdout.splitlines()) == ["0 node0 node[0-1]", "1 node1 node[0-1]"], res.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The tiny dataset, made once before the job (both nodes read it from the shared disk)."""
    from mdk.engine import build
    from mdk.models.build import build_model

    d = tmp_path_factory.mktemp("two_node_data")
    cfg = compose([*TINY, f"paths.data={d}", "trainer.device=cpu"])
    build.build_data(cfg, build_model(cfg).grid)
    return d


@pytest.mark.slow
def test_two_node_job_trains_the_one_process_model_bit_for_bit(slurm_two_nodes, data, tmp_path):
    from launchers.processes.spawn import run_ranks
    from mdk.engine.runner import stage_on_rank

    cluster = slurm_two_nodes
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(REPO / "run.py"), "-m", *TINY, *EXACT, "trainer.device=cpu",
           f"paths.data={data}", f"hydra.sweep.dir={sweep}", "hydra/launcher=submitit_slurm",
           f"hydra.launcher.partition={cluster.partition}", "hydra.launcher.gpus_per_node=0",
           "hydra.launcher.timeout_min=10", "dist.nodes=2"]
    env = dict(cluster.env, MDK_NO_BOOTSTRAP="1", PYTHONPATH=str(REPO))
    env.pop("GLOO_SOCKET_IFNAME", None)  # the job inherits it: "lo" would keep the nodes apart
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Meanwhile (the job is mostly queueing and importing): the same run in one process.
        cfg = compose([*TINY, *EXACT, "trainer.device=cpu", f"paths.data={data}",
                       f"paths.checkpoints={tmp_path / 'one'}"])
        run_ranks(cfg, tmp_path / "one_run", stage_on_rank)
        out, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:] + cluster.logs(15)
    [job] = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert job["status"] == "completed", job
    # One task per node: submitit's log of each task says where it ran.
    task_logs = sorted((sweep / ".submitit" / job["job_id"]).glob("*_log.out"))
    where = [re.search(r"hostname=(\w+), local_rank=0\(1\), node=(\d)\(2\), global_rank=(\d)\(2\)",
                       p.read_text()).groups() for p in task_logs]
    assert sorted(where) == [("node0", "0", "0"), ("node1", "1", "1")]
    # They met where SLURM put them: node0, the port submitit derives from the job id.
    job_cfg = OmegaConf.load(sweep / "0" / ".hydra" / "config.yaml")
    assert re.fullmatch(r"node0:\d+", job_cfg.dist.dist_url) and job_cfg.dist.nodes == 2
    two = torch.load(sweep / "0" / "checkpoints" / "step1" / "last.pth", weights_only=False)
    one = torch.load(tmp_path / "one" / "step1" / "last.pth", weights_only=False)
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["trainer"]["iter"] == one["trainer"]["iter"] == 12  # 2 epochs of 48 images in global batches of 8
    assert two["model"].keys() == one["model"].keys()
    assert all(torch.equal(two["model"][k], one["model"][k]) for k in one["model"])
    st2, st1 = two["optimizer"]["state"], one["optimizer"]["state"]
    assert all(torch.equal(st2[i][m], st1[i][m]) for i in st1 for m in ("exp_avg", "exp_avg_sq"))
    assert two["metric"]["map50"] == one["metric"]["map50"]
