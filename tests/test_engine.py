"""A few-iteration step1 run: best/last written, resume at the right iteration, same seed -> same weights."""
from __future__ import annotations

from pathlib import Path

import torch

from mdk.checkpoint.files import load_checkpoint
from mdk.engine import build
from mdk.models.build import build_model
from mdk.engine.runner import run_stage


def test_run_writes_best_and_last_with_full_state(tiny_cfg, tmp_path):
    cfg = tiny_cfg("trainer.limit_train_batches=3")
    out = run_stage(cfg, tmp_path)
    d = Path(cfg.paths.checkpoints) / "step1"
    last, best = load_checkpoint(d / "last.pth"), load_checkpoint(d / "best.pth")
    assert last["trainer"]["iter"] == 6 and last["trainer"]["epoch"] == 1 and last["stage"] == "step1"
    # the run state's parts, one entry each, beside the weights and what they mean
    assert set(last) == {"format", "model", "stage", "stage_spec", "config", "world_size",
                         "meaning", "hparams", "optimizer", "scheduler", "loss", "trainer",
                         "hooks", "rng", "metric", "epoch_done"}
    assert set(last["hooks"]) == {"CheckpointHook"}
    assert last["meaning"]["dataset.class_names"] == ["circle", "square", "triangle", "star", "cross"]
    assert last["meaning"]["step.name"] == "step1" and "chip" not in last["meaning"]  # float
    assert last["hparams"]["optim.lr"] == cfg.optim.lr and last["hparams"]["trainer.epochs"] == 2
    assert last["config"]["trainer"]["batch_size"] == 8
    best_metric = best["hooks"]["CheckpointHook"]["best_metric"]
    assert 0.0 <= best_metric <= 1.0 and out.iterations == 6
    assert out.best_map50 == best_metric
    assert (tmp_path / "lr_step1.png").stat().st_size > 1000


def test_rerun_resumes_from_last(tiny_cfg, tmp_path):
    run_stage(tiny_cfg("trainer.limit_train_batches=2", "trainer.epochs=1"), tmp_path)
    out = run_stage(tiny_cfg("trainer.limit_train_batches=2", "trainer.epochs=2"), tmp_path)
    assert out.iterations == 4  # 2 resumed + 2 new, not 4 new
    # Resumed run equals an uninterrupted two-epoch run, bit for bit.
    resumed = load_checkpoint(Path(tiny_cfg().paths.checkpoints) / "step1" / "last.pth")["model"]
    cfg2 = tiny_cfg("trainer.limit_train_batches=2", f"paths.checkpoints={tmp_path}/fresh")
    run_stage(cfg2, tmp_path)
    fresh = load_checkpoint(Path(cfg2.paths.checkpoints) / "step1" / "last.pth")["model"]
    assert all(torch.equal(resumed[k], fresh[k]) for k in fresh)


def test_same_seed_same_weights_other_seed_differs(tiny_cfg, tmp_path):
    def weights(*extra: str) -> dict:
        cfg = tiny_cfg("trainer.limit_train_batches=2", "trainer.epochs=1", *extra)
        run_stage(cfg, tmp_path)
        return load_checkpoint(Path(cfg.paths.checkpoints) / "step1" / "last.pth")["model"]

    a = weights(f"paths.checkpoints={tmp_path}/a")
    b = weights(f"paths.checkpoints={tmp_path}/b")
    c = weights(f"paths.checkpoints={tmp_path}/c", "seed=1")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_freeze_patterns_freeze_parameters(tiny_cfg, tmp_path):
    cfg = tiny_cfg("trainer.limit_train_batches=2", "trainer.epochs=1", "model.freeze=[layers.0.*]")
    build.seed_everything(cfg.seed)  # run_stage seeds the same way before building the model
    init = {k: v.clone() for k, v in build_model(cfg).state_dict().items()}
    run_stage(cfg, tmp_path)
    w = load_checkpoint(Path(cfg.paths.checkpoints) / "step1" / "last.pth")["model"]
    assert torch.equal(w["layers.0.conv.weight"], init["layers.0.conv.weight"])
    assert not torch.equal(w["layers.1.conv.weight"], init["layers.1.conv.weight"])
