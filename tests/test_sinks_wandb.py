"""wandb (offline): the run id is kept with the job, so a resume or requeue continues the same
run; group = sweep, job_type = stage; one run per stage; both sinks at once."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import compose
from mdk.sinks.base import MultiSink
from mdk.sinks.build import build_sinks
from mdk.sinks.tensorboard_sink import TensorBoardSink
from mdk.sinks.wandb_sink import WandbSink

wandb = pytest.importorskip("wandb", reason="wandb is not installed")

CONFIG = {"step": {"name": "step1"}, "seed": 3, "optim": {"lr": 0.01}}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))


def offline_runs(run_dir: Path) -> list[str]:
    """Run ids of the offline folders ``offline-run-<YYYYMMDD_HHMMSS>-<id>``; wandb appends
    ``-1`` to the folder of a run started in the same second as one already there."""
    return sorted(p.name.split("-")[3] for p in (run_dir / "wandb").glob("offline-run-*"))


def make(run_dir: Path, stage: str, **kw) -> WandbSink:
    sink = build_sinks(compose(["logger=wandb", "trainer.device=cpu"]).logger, run_dir, CONFIG,
                       True, stage=stage, **kw)
    assert isinstance(sink, WandbSink)
    return sink


def test_requeued_job_continues_the_same_run(tmp_path):
    job = tmp_path / "sweep" / "3"
    first = make(job, "step1", group="sweep")
    run_id = first.run.id
    assert first.run.group == "sweep" and first.run.job_type == "step1"
    assert first.run.name == "3-step1" and first.run.config["seed"] == 3
    first.log({"loss/total": 1.0}, 10)
    first.close()
    assert json.loads((job / "wandb_ids.json").read_text()) == {"step1": run_id}
    # Requeued (same job dir), resuming from its checkpoint at step 8.
    again = make(job, "step1", group="sweep", resume_step=8)
    assert again.run.id == run_id
    again.log({"loss/total": 0.5}, 12)
    again.close()
    assert offline_runs(job) == [run_id, run_id]   # two offline folders, one run id to sync


def test_each_stage_and_each_job_has_its_own_run(tmp_path):
    a, b = tmp_path / "0", tmp_path / "1"
    ids = {}
    for job in (a, b):
        for stage in ("step1", "step2"):
            s = make(job, stage, group="sw")
            ids[(job.name, stage)] = s.run.id
            assert s.run.job_type == stage
            s.close()
    assert len(set(ids.values())) == 4
    assert json.loads((a / "wandb_ids.json").read_text()) == {
        "step1": ids[("0", "step1")], "step2": ids[("0", "step2")]}


def test_both_sinks_at_once(tmp_path):
    cfg = compose(["logger=[tensorboard,wandb]", "trainer.device=cpu"])
    sink = build_sinks(cfg.logger, tmp_path, CONFIG, True, stage="step1")
    assert isinstance(sink, MultiSink)
    assert sorted(type(s).__name__ for s in sink.sinks) == ["TensorBoardSink", "WandbSink"]
    sink.log({"loss/total": 1.5}, 2)
    sink.log_image("val/detections", torch.zeros(3, 6, 6, dtype=torch.uint8), 2)
    sink.log_text("val/ap", "| a | 0.5 |", 2)
    sink.close()
    assert any(isinstance(s, TensorBoardSink) for s in sink.sinks)
    assert (tmp_path / "tensorboard" / "step1").is_dir() and len(offline_runs(tmp_path)) == 1
