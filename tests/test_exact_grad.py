"""World-size-invariant gradients (dist.exact_chunk): chunked gradients are the whole-batch
gradient, and 1, 2 and 4 processes train bit-identical float32 weights."""
from __future__ import annotations

import pytest
import torch

from mdk.config import validate
from mdk.engine.align_rank import _double_inputs
from mdk.errors import ConfigError
from mdk.engine.exact_grad import chunked_forward_backward, prepare
from helpers.ddp import ORDER_SENSITIVE, ordered_sum_rank, tiny_cfg


def _model_and_batch(tmp_path, dtype: torch.dtype):
    from mdk.engine import build
    from mdk.models.build import build_model
    from mdk.models.loss import YoloLoss

    cfg = tiny_cfg(tmp_path, "model.net.batch_norm=false")
    torch.manual_seed(0)
    model = build_model(cfg).to(dtype)
    train_ds, _ = build.build_data(cfg, model.grid)
    items = [train_ds[i] for i in range(8)]
    images = torch.stack([it[0] for it in items])
    targets = torch.stack([it[1] for it in items]).to(dtype)
    loss_fn = YoloLoss(cfg.dataset.num_classes, cfg.model.net.boxes_per_cell)

    def fb(x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        terms = loss_fn(model(x).to(dtype), t)
        terms["total"].backward()
        return terms

    return model, fb, images, targets


def test_chunked_gradient_is_the_whole_batch_gradient(tmp_path):
    """float64, one process: chunks of 2 or 4 images give the batch-of-8 gradient and loss (the
    loss is a per-image mean, so the mean of chunk means is the batch mean)."""
    model, fb, images, targets = _model_and_batch(tmp_path, torch.float64)
    _double_inputs(model)  # the input quantizer emits float32: run every layer in float64
    whole_terms = fb(images, targets)
    whole = [p.grad.clone() for p in model.parameters()]
    assert max(float(g.abs().max()) for g in whole) > 1e-3  # a real gradient, not zeros
    for chunk in (2, 4):
        terms = chunked_forward_backward(model, fb, images, targets, chunk)
        for g, p in zip(whole, model.parameters()):
            err = float((p.grad - g).abs().max() / g.abs().max().clamp_min(1e-30))
            assert err < 1e-12, (chunk, err)
        assert float(terms["total"]) == pytest.approx(float(whole_terms["total"].detach()), rel=1e-12)


def test_exact_mode_refuses_batchnorm_and_bad_chunks(tmp_path):
    from mdk.models.build import build_model

    bn_model = build_model(tiny_cfg(tmp_path))  # the default has BatchNorm
    with pytest.raises(ConfigError, match=r"BatchNorm.*model\.net\.batch_norm=false"):
        prepare(bn_model, 2)
    prepare(build_model(tiny_cfg(tmp_path, "model.net.batch_norm=false")), 2)
    with pytest.raises(ConfigError, match=r"dist\.exact_chunk=3 must divide the per-process "
                                          r"batch .* 8/2 = 4"):
        validate(tiny_cfg(tmp_path, "trainer.batch_size=8", "dist.gpus=2", "dist.exact_chunk=3"))
    with pytest.raises(ConfigError, match=r"dist\.exact_chunk=0 must be an integer >= 1"):
        validate(tiny_cfg(tmp_path, "dist.exact_chunk=0"))
    with pytest.raises(ConfigError, match=r"dist\.cpu_threads='many' must be auto or an integer"):
        validate(tiny_cfg(tmp_path, "dist.cpu_threads=many"))
    with pytest.raises(ConfigError, match=r"dist\.cpu_threads=0 must be auto or an integer >= 1"):
        validate(tiny_cfg(tmp_path, "dist.cpu_threads=0"))
    validate(tiny_cfg(tmp_path, "trainer.batch_size=8", "dist.gpus=2", "dist.exact_chunk=2",
                      "dist.cpu_threads=1", "model.net.batch_norm=false"))
    # BN is folded from step2 on: exact gradients are fine there with the BN model
    validate(tiny_cfg(tmp_path, "step=step2", "dist.exact_chunk=2"))


@pytest.mark.ddp
@pytest.mark.parametrize("world", [2, 4])
def test_ordered_sum_adds_in_global_order_for_every_world_size(tmp_path, world):
    """The same parts split over 2 or 4 ranks sum to the one-process left-to-right result on
    every rank; an all-reduce of per-rank sums does not (the values are chosen so order shows)."""
    from launchers.processes.spawn import run_ranks

    one = torch.tensor([ORDER_SENSITIVE[0]], dtype=torch.float32)
    for v in ORDER_SENSITIVE[1:]:
        one += v
    assert one.item() == 1.0
    (tmp_path / "run").mkdir()
    res = run_ranks(tiny_cfg(tmp_path, f"dist.gpus={world}"), tmp_path / "run", ordered_sum_rank)
    assert res["ordered"] == [1.0] * world
    if world == 2:  # (1e8 + 1) + (-1e8 + 1) = 0: the order changed the bits
        assert res["allreduce"] == [0.0, 0.0]


@pytest.mark.ddp
@pytest.mark.slow
def test_align_exact_mode_is_bit_identical_for_worlds_1_2_4(tmp_path):
    """The alignment bar in float32: 1x8, 2x4 and 4x2 end with the same bits (difference 0)."""
    from mdk.tools import ckpt_diff
    from launchers.align import validated_config, run_alignment
    from helpers.ddp import TINY

    cfg = validated_config([*TINY, "dataset.generate.num_val=8", "dataset.generate.num_train=48",
                          f"paths.data={tmp_path}/data"])
    report = run_alignment(cfg, [2, 4], batch_size=8, iters=6, out=tmp_path / "al", exact_chunk=2)
    for w in (2, 4):
        assert all(d.max_abs == 0.0 for d in report[w]), ckpt_diff.format_table(report[w], 5)
    init = torch.load(tmp_path / "al" / "init.pth")
    w1 = torch.load(tmp_path / "al" / "world1.pth")["model"]
    moved, _ = ckpt_diff.diff_state_dicts(init, w1)
    assert max(d.max_rel for d in moved) > 1e-3  # training moved the weights


@pytest.mark.ddp
def test_sync_bn_on_gloo_equals_one_process_batchnorm(tmp_path):
    """dist.sync_bn on CPU: 2 ranks with 4 images each normalise, back-propagate and update
    running statistics exactly as one BatchNorm2d on all 8 (float64, two steps)."""
    from launchers.processes.spawn import run_ranks
    from helpers.ddp import bn_batch, global_bn_rank

    (tmp_path / "run").mkdir()
    res = run_ranks(tiny_cfg(tmp_path, "dist.gpus=2"), tmp_path / "run", global_bn_rank)
    x, dy = bn_batch()
    bn = torch.nn.BatchNorm2d(4).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 0.5, 2.0, -1.0]))
        bn.bias.copy_(torch.tensor([0.0, 0.1, -0.2, 0.3]))

    def close(a, b) -> None:
        a = torch.as_tensor(a, dtype=torch.float64)
        assert a.shape == b.shape
        assert float((a - b).abs().max()) <= 1e-12 * max(1.0, float(b.abs().max()))

    for step in range(2):
        xs = (x * (1 + step)).clone().requires_grad_(True)
        y = bn(xs)
        (y * dy).sum().backward()
        close([v for part in res[f"y{step}"] for v in part], y.detach())
        close([v for part in res[f"dx{step}"] for v in part], xs.grad)
    close(res["dw"], bn.weight.grad)
    close(res["db"], bn.bias.grad)
    for mean, var, n in res["running"]:  # the same on both ranks, and as one process
        close(mean, bn.running_mean)
        close(var, bn.running_var)
        assert n == int(bn.num_batches_tracked) == 2


@pytest.mark.ddp
@pytest.mark.slow
def test_exact_chunk_quantized_stage_of_a_bn_model_is_world_size_invariant(tmp_path):
    """From step2 on BN is folded, so exact chunks work with the BN model: step3 (5-bit weights
    and activations) on 1 and on 2 processes ends with the same bits."""
    import shutil

    from launchers.processes.spawn import run_ranks
    from mdk.engine.runner import run_stage, stage_on_rank
    from mdk.stage import config_for_stage

    base = tiny_cfg(tmp_path, "trainer.batch_size=8", "trainer.epochs=1")
    assert base.model.net.batch_norm is True
    (tmp_path / "run").mkdir()
    for s in ("step1", "step2", "cal"):
        run_stage(config_for_stage(base, s), tmp_path / "run")
    shutil.copytree(tmp_path / "ck", tmp_path / "ck2")
    states = []
    for world, ck in ((1, "ck"), (2, "ck2")):
        cfg = tiny_cfg(tmp_path, "trainer.batch_size=8", "trainer.epochs=1", "step=step3",
                       f"paths.checkpoints={tmp_path}/{ck}", f"dist.gpus={world}",
                       "dist.exact_chunk=2", "dist.cpu_threads=1")
        run_ranks(config_for_stage(cfg, "step3"), tmp_path / "run", stage_on_rank)
        states.append(torch.load(tmp_path / ck / "step3" / "last.pth", weights_only=False))
    a, b = states
    assert a["trainer"]["iter"] == b["trainer"]["iter"] > 0 and b["world_size"] == 2
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
