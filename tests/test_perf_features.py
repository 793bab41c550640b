"""Activation checkpointing (same gradients, BN stats updated once) and AMP (runs through the
quantized stages and still converges). Speed and memory are measured by benchmarks/, not here."""
from __future__ import annotations

import copy

import pytest
import torch

from mdk.models.build import build_model
from mdk.engine.loop import HookBase, Trainer
from mdk.models.gnetdet import GNetDet
from mdk.models.loss import YoloLoss
from mdk.stage import apply_stage

SMALL = dict(channels=[8, "M", 8, "M", 16, 16, "M", 16, 16, "M", 16, 16], mask_bits=[3] * 6 + [8] * 3)


def _model(bn: bool = True) -> GNetDet:
    torch.manual_seed(0)
    return GNetDet(5, image_size=64, batch_norm=bn, **SMALL)


def _batch(n: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 64, 64), dtype=torch.uint8, generator=g)
    targets = torch.zeros(n, 4, 4, 15)
    targets[:, 1, 2, :4] = torch.tensor([0.5, 0.5, 0.3, 0.4])
    targets[:, 1, 2, 4] = 1.0
    targets[:, 1, 2, 10] = 1.0
    return images, targets


def _grads(model: GNetDet, images: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    model.train()
    model.zero_grad(set_to_none=True)
    YoloLoss(5)(model(images), targets)["total"].backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("stage", ["step1", "step3"])
def test_checkpointing_gives_identical_gradients_and_bn_stats(stage):
    plain = _model()
    if stage == "step3":
        for layer in plain.layers:
            layer.cap.fill_(4.0)
        apply_stage(plain, "step3")
    ckpt = copy.deepcopy(plain)
    ckpt.activation_checkpointing = True
    assert len(ckpt.segments()) > 1  # really split: several recomputed groups
    images, targets = _batch()
    g0, g1 = _grads(plain, images, targets), _grads(ckpt, images, targets)
    assert g0.keys() == g1.keys() and len(g0) > 0
    for k in g0:
        assert torch.allclose(g0[k], g1[k], rtol=0, atol=1e-6), k
        assert g0[k].abs().sum() > 0, k  # every layer really got a gradient
    # BN running stats moved exactly once (not again during the backward recompute).
    for (k, a), (_, b) in zip(plain.named_buffers(), ckpt.named_buffers()):
        assert torch.equal(a, b), k
    if stage == "step1":
        assert int(ckpt.layers[0].bn.num_batches_tracked) == 1


@pytest.mark.parametrize("bn,stage", [(True, "step1"), (False, "step1"), (True, "step2"),
                                      (True, "step3")])
def test_checkpointing_recomputes_batch_slices_only_where_results_stay(bn, stage):
    """Float segments without training-mode BN (BN-free step1, step2 with BN folded) are
    checkpointed per batch slice, so the backward recomputes one slice at a time. A training-mode
    BN needs the whole batch's statistics, and 5-bit activations (step3) would turn the slices'
    last-bit differences into level flips: those run whole."""
    model = _model(bn=bn)
    if stage != "step1":
        for layer in model.layers:
            layer.cap.fill_(4.0)
        apply_stage(model, stage)
    sliced = stage == "step2" or not bn
    plain = copy.deepcopy(model)
    model.activation_checkpointing = True
    seen: list[int] = []
    model.layers[0].register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    images, targets = _batch(n=8)
    g_ckpt, g_plain = _grads(model, images, targets), _grads(plain, images, targets)
    # forward + the backward's recompute of layer 0, as batch sizes
    assert seen == ([2, 2, 2, 2] * 2 if sliced else [8, 8])
    for k in g_plain:  # the same gradients (slices change float rounding only)
        assert torch.allclose(g_ckpt[k], g_plain[k], rtol=1e-5, atol=1e-6), k
        assert g_plain[k].abs().sum() > 0, k


def test_checkpointing_off_in_eval_and_no_grad():
    model = _model()
    model.activation_checkpointing = True
    images, _ = _batch()
    model.eval()
    with torch.no_grad():
        out = model(images)
    ref = copy.deepcopy(model)
    ref.activation_checkpointing = False
    with torch.no_grad():
        assert torch.equal(out, ref(images))
    assert out.grad_fn is None


def test_config_switches_checkpointing_on(tiny_cfg):
    assert build_model(tiny_cfg("trainer.activation_checkpointing=true")).activation_checkpointing
    assert not build_model(tiny_cfg()).activation_checkpointing


class _Losses(HookBase):
    def __init__(self) -> None:
        self.values: list[float] = []

    def after_step(self) -> None:
        self.values.append(float(self.trainer.loss_terms["total"].detach()))


def _overfit(model: GNetDet, amp: bool, steps: int = 20) -> list[float]:
    """A few AdamW steps on one fixed batch through the real Trainer; the per-step losses."""
    images, targets = _batch(n=4, seed=1)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    t = Trainer(model, YoloLoss(5), opt, [(images, targets)] * steps, torch.device("cpu"),
                epochs=1, iters_per_epoch=steps, grad_clip=10.0,
                amp_dtype=torch.bfloat16 if amp else None)
    rec = _Losses()
    t.register_hooks([rec])
    t.train()
    return rec.values


@pytest.mark.parametrize("stage", ["step1", "step2", "step3"])
def test_amp_bf16_trains_through_quantized_stages(stage):
    model = _model(bn=stage == "step1")
    if stage != "step1":
        for layer in model.layers:
            layer.cap.fill_(6.0)
        apply_stage(model, stage)
    float_losses = _overfit(copy.deepcopy(model), amp=False)
    losses = _overfit(model, amp=True)
    assert all(torch.isfinite(torch.tensor(losses)))
    # Converges: the last losses are well below the first (a randomly initialised step3 model
    # with fixed caps learns slowly, float too), and about as low as the float run's.
    last, float_last = sum(losses[-3:]) / 3, sum(float_losses[-3:]) / 3
    assert last < 0.85 * losses[0], losses
    assert last < 1.25 * float_last + 0.05, (losses, float_losses)
    # bf16 autocast is an approximation of the float run, not another computation.
    assert abs(losses[0] - float_losses[0]) < 0.05 * float_losses[0], (losses[0], float_losses[0])
    # The model really ran in bf16 under autocast (not silently float32).
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(_batch()[0]).dtype == torch.bfloat16


@pytest.mark.parametrize("value, device, amp, expect", [
    ("auto", "cpu", False, True),     # oneDNN convolutions are faster in NHWC on the CPU
    ("auto", "cuda", True, True),     # tensor cores with AMP
    ("auto", "cuda", False, False),   # float32 on CUDA: not measured faster, left as it was
    (False, "cpu", False, False), (True, "cuda", False, True),
])
def test_channels_last_auto_resolves_per_device(value, device, amp, expect):
    from omegaconf import OmegaConf

    from mdk.engine.precision import channels_last

    trainer = OmegaConf.create({"channels_last": value, "amp": amp})
    assert channels_last(trainer, torch.device(device)) is expect


@pytest.mark.parametrize("amp, device, float_model, native, expect", [
    ("auto", "cpu", True, True, torch.bfloat16),  # step1 on a bf16 CPU: bf16 autocast
    ("auto", "cpu", True, False, None),           # an AVX2-only CPU emulates bf16 (~7x slower)
    ("auto", "cpu", False, True, None),           # quantized stages keep float32 (cap/31 grids)
    ("auto", "cuda", True, True, None),           # CUDA: float32 + TF32 stays the default
    (True, "cuda", False, False, torch.float16), (True, "cpu", False, False, torch.bfloat16),
    (False, "cpu", True, True, None),
])
def test_amp_auto_resolves_per_device_and_stage(amp, device, float_model, native, expect,
                                                monkeypatch):
    from omegaconf import OmegaConf

    from mdk.engine import precision
    from mdk.engine.precision import amp_dtype, channels_last

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    trainer = OmegaConf.create({"amp": amp, "amp_dtype": "auto", "channels_last": "auto"})
    assert amp_dtype(trainer, torch.device(device), float_model) is expect
    # channels_last=auto follows the resolved amp on CUDA, and is on for every CPU stage
    assert channels_last(trainer, torch.device(device), float_model) is (
        device == "cpu" or expect is not None)


def test_default_step1_trains_in_bf16_on_a_bf16_cpu_and_step2_does_not(monkeypatch):
    """The composed defaults, resolved the way train_stage resolves them."""
    from mdk.compose import compose
    from mdk.engine import precision
    from mdk.engine.precision import amp_dtype
    from mdk.stage_config import StageConf

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    cfg = compose(["trainer.device=cpu"])
    cpu = torch.device("cpu")
    assert cfg.trainer.amp == "auto" and cfg.trainer.epochs == 15  # the default run, not a preset
    kinds = {}
    for name in ("step1", "step2", "step3", "step4"):
        spec = StageConf.from_node(compose([f"step={name}"]).step)
        kinds[name] = amp_dtype(cfg.trainer, cpu, spec.quant.is_float)
    assert kinds == {"step1": torch.bfloat16, "step2": None, "step3": None, "step4": None}


def test_channels_last_training_matches_contiguous_to_rounding():
    """The layout changes the order of the convolution sums, not the maths: one AdamW step of the
    quantized-weights model in NHWC gives the NCHW step's weights to float rounding."""
    images, targets = _batch()
    results = []
    for cl in (False, True):
        model = _model()
        if cl:
            model.to(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = images.float() / 255
        loss = YoloLoss(5)(model(x.contiguous(memory_format=torch.channels_last) if cl else x),
                           targets)["total"]
        loss.backward()
        opt.step()
        results.append((loss.detach(), [p.detach().clone() for p in model.parameters()]))
    (l0, p0), (l1, p1) = results
    assert torch.allclose(l0, l1, rtol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(p0, p1))
