"""What only a GPU can show: training, AMP resume, the NaN stop, the chain with its bit-exact
export and evaluation on CUDA. Marked ``gpu``: they run wherever CUDA exists and are skipped with
the reason elsewhere (tests/conftest.py). Two-GPU (NCCL) tests: tests/test_multigpu.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, TINY, run_cmd_env
from mdk.checkpoint.files import load_checkpoint
from mdk.engine.runner import run_stage

pytestmark = pytest.mark.gpu
CUDA = ["trainer.device=cuda", "trainer.deterministic=true"]


def _run(tmp: Path, name: str, *extra: str, fault: str = "") -> subprocess.CompletedProcess:
    env = run_cmd_env()
    env.pop("MDK_FAULT", None)
    if fault:
        env["MDK_FAULT"] = fault
    args = [*TINY, f"paths.data={tmp / 'data'}", f"paths.checkpoints={tmp / name}",
            f"hydra.run.dir={tmp / 'runs' / name}", *CUDA, *extra]
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_step1_trains_on_cuda_and_repeats_bit_for_bit_in_deterministic_mode(tiny_cfg, tmp_path):
    for name in ("a", "b"):
        res = run_stage(tiny_cfg(*CUDA, f"paths.checkpoints={tmp_path}/{name}"), tmp_path / name)
        assert res.best_map50 is not None and res.final_loss > 0
    ck = load_checkpoint(tmp_path / "a" / "step1" / "last.pth")
    assert ck["config"]["trainer"]["device"] == "cuda"
    _same(ck["model"], _weights(tmp_path / "b" / "step1" / "last.pth"))


@pytest.mark.slow
def test_amp_fp16_kill_then_resume_equals_uninterrupted(tmp_path):
    amp = ("trainer.amp=true", "trainer.amp_dtype=float16", "trainer.checkpoint_every_iters=2")
    p = _run(tmp_path, "ref", *amp)
    assert p.returncode == 0, p.stderr[-3000:]
    p = _run(tmp_path, "killed", *amp, fault="kill:iter:5")
    assert p.returncode != 0
    assert load_checkpoint(tmp_path / "killed" / "step1" / "last.pth")["trainer"]["iter"] < 12
    p = _run(tmp_path, "killed", *amp)  # resumes from last.pth
    assert p.returncode == 0, p.stderr[-3000:]
    ref = load_checkpoint(tmp_path / "ref" / "step1" / "last.pth")
    got = load_checkpoint(tmp_path / "killed" / "step1" / "last.pth")
    assert ref["scaler"] is not None and ref["scaler"] == got["scaler"]  # GradScaler state resumed
    _same(ref["model"], got["model"])


def test_nan_loss_on_cuda_stops_naming_the_iteration_and_keeps_the_last_good(tmp_path):
    p = _run(tmp_path, "nan", "trainer.checkpoint_every_iters=1", fault="nan:iter:3")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    line = p.stderr.strip().splitlines()[-1]
    assert "training stopped: loss is not finite at iteration 3" in line, line
    assert load_checkpoint(tmp_path / "nan" / "step1" / "last.pth")["trainer"]["iter"] == 2


@pytest.mark.slow
def test_chain_on_cuda_exports_a_bit_exact_chip_model_and_eval_matches_cpu(tmp_path):
    from mdk.tools.evaluate import evaluate_path

    p = _run(tmp_path, "chain", "pipeline=[step1,step2,cal,step3,step4]", "trainer.epochs=1")
    assert p.returncode == 0, p.stderr[-3000:]
    # export_best raises when the integer reference disagrees with the fake-quant model on any
    # activation, so reaching the summary line means 0 mismatches on the GPU-trained model
    assert f"chip model exported to {tmp_path}/chain/step4/chip_model" in p.stdout + p.stderr
    common = [*TINY, f"paths.data={tmp_path / 'data'}"]
    for stage in ("step1", "step3"):
        ck = tmp_path / "chain" / stage / "best.pth"
        cpu = evaluate_path(ck, [*common, "trainer.device=cpu"])
        gpu = evaluate_path(ck, [*common, "trainer.device=cuda"])
        assert abs(cpu["map50"] - gpu["map50"]) <= 0.01, (stage, cpu, gpu)
        assert abs(cpu["loss"] - gpu["loss"]) <= 1e-3 * abs(cpu["loss"]), (stage, cpu, gpu)


def test_activation_checkpointing_gives_the_same_losses_in_deterministic_mode(tiny_cfg):
    from mdk.engine import build, precision
    from mdk.models.build import build_model
    from mdk.engine.loop import HookBase, Trainer

    def losses(ac: bool) -> list[float]:
        cfg = tiny_cfg(*CUDA, "model.net.batch_norm=false",
                       f"trainer.activation_checkpointing={str(ac).lower()}")
        precision.configure(cfg.trainer, torch.device("cuda"))
        build.seed_everything(0)
        model = build_model(cfg).cuda()
        gen = torch.Generator().manual_seed(1)
        x = torch.randint(0, 256, (8, 3, 64, 64), dtype=torch.uint8, generator=gen)
        b = cfg.model.net.boxes_per_cell
        t = torch.zeros(8, 2, 2, 5 * b + cfg.dataset.num_classes)
        t[:, 0, 1, :4], t[:, 0, 1, 4], t[:, 0, 1, 5 * b] = 0.5, 1.0, 1.0
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tr = Trainer(model, build.build_loss(cfg), opt, [(x, t)] * 4, torch.device("cuda"), 1, 4)
        seen: list[float] = []

        class Rec(HookBase):
            def after_step(self) -> None:
                seen.append(float(self.trainer.loss_terms["total"].detach()))

        tr.register_hooks([Rec()])
        tr.train()
        return seen

    assert losses(True) == losses(False)


def test_exact_chunk_repeats_bit_for_bit_on_cuda(tiny_cfg, tmp_path):
    exact = ("dist.exact_chunk=2", "model.net.batch_norm=false", "trainer.epochs=1")
    for name in ("a", "b"):
        run_stage(tiny_cfg(*CUDA, *exact, f"paths.checkpoints={tmp_path}/{name}"), tmp_path / name)
    ck = load_checkpoint(tmp_path / "a" / "step1" / "last.pth")
    _same(ck["model"], _weights(tmp_path / "b" / "step1" / "last.pth"))
    b = load_checkpoint(tmp_path / "b" / "step1" / "last.pth")
    assert ck["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()


def test_calibration_statistics_on_cuda_equal_cpu():
    from mdk.quant.cal_stats import mse_cap, percentile_and_max

    g = torch.Generator().manual_seed(3)
    for shape in ((8, 16, 56, 56), (2, 64, 224, 224)):
        x = torch.randn(shape, generator=g).round(decimals=3)
        for p in (99.0, 99.9):
            cpu = percentile_and_max(x, p)
            gpu = percentile_and_max(x.cuda(), p)
            assert [float(v) for v in cpu] == [float(v) for v in gpu], (shape, p)
        assert float(mse_cap(x, 64)) == pytest.approx(float(mse_cap(x.cuda(), 64)), rel=1e-6)


def test_prefetched_batches_equal_plain_copies():
    from mdk.engine.device_io import CudaPrefetcher

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=g).pin_memory(),
                torch.randn(4, 2, 2, 15, generator=g), torch.arange(4) + 4 * i) for i in range(5)]
    got = list(CudaPrefetcher(iter(batches), torch.device("cuda")))
    assert len(got) == 5
    for (a, b, c), (x, y, z) in zip(batches, got):
        assert x.is_cuda and y.is_cuda and not z.is_cuda  # the indices stay on the host
        assert torch.equal(x.cpu(), a) and torch.equal(y.cpu(), b) and torch.equal(z, c)


def _starts_from_weights(tiny_cfg, tmp_path: Path, caplog, device: list[str]) -> None:
    """A CPU-trained checkpoint starts a step1 on ``device`` (tensors moved where the model is),
    with its first layer frozen for one epoch and released for the next."""
    src = tmp_path / "src"
    run_stage(tiny_cfg("trainer.device=cpu", "trainer.epochs=1", f"paths.checkpoints={src}"), src)
    start = src / "step1" / "last.pth"
    frozen = (f"step.init_weights={start}", "model.freeze=[layers.0.*]", "model.freeze_epochs=1")
    with caplog.at_level("INFO"):
        run_stage(tiny_cfg(*device, *frozen, "trainer.epochs=1", f"paths.checkpoints={tmp_path}/a"),
                  tmp_path / "a")
        run_stage(tiny_cfg(*device, *frozen, "trainer.epochs=2", f"paths.checkpoints={tmp_path}/b"),
                  tmp_path / "b")
    assert f"step1 starts from {start} (an mdk checkpoint)" in caplog.text
    assert "epoch 2: model.freeze released (layers.0.*)" in caplog.text
    source, one, two = (_weights(p) for p in (start, tmp_path / "a" / "step1" / "last.pth",
                                              tmp_path / "b" / "step1" / "last.pth"))
    for k in ("layers.0.conv.weight", "layers.0.conv.bias"):
        # frozen: still the source's values after the first epoch; trained after the release
        assert torch.equal(one[k], source[k]) and not torch.equal(two[k], source[k]), k
    assert not torch.equal(one["layers.2.conv.weight"], source["layers.2.conv.weight"])


def test_a_cpu_checkpoint_starts_a_cuda_step1_frozen_then_released(tiny_cfg, tmp_path, caplog):
    _starts_from_weights(tiny_cfg, tmp_path, caplog, CUDA)
