"""loss=gti (the GTI MDK's GNetDetLoss terms and weights) and the loss config group."""
from __future__ import annotations


import pytest
import torch
import torch.multiprocessing as mp
from hydra.utils import instantiate

from conftest import TINY, compose
from mdk.models.gti_loss import GtiLoss, signed_sqrt
from mdk.models.loss import YoloLoss
from gti_loss_ranks import rank_main, three_steps
from helpers.loss_example import hand_example

# The hand example (test_loss.hand_example): responsible box 0 with IoU 15/46, box 1 IoU 0.25.
# smooth-L1 (beta 1) of a difference d < 1 is d^2 / 2; predictions get +1e-8 first (tolerance 1e-7).
LOC = 5 * (0.02 + 0.005)            # x off by 0.2; sqrt(0.36) - sqrt(0.25) = 0.1; y, sqrt(w) exact
CONTAIN = 2 * (0.6 - 15 / 46) ** 2 / 2  # conf 0.6 -> IoU 15/46: 0.27391^2 / 2 = 0.0375142, x 2
NOT_CONTAIN = 0.4 ** 2 / 2          # box 1 of the object cell -> 0: 0.08
NOOBJ = 0.005 * (0.02 + 0.005)      # empty cell confidences 0.2 and -0.1 -> 0
CLS = 0.3 ** 2 / 2                  # 0.7 -> 1: 0.045
SUM = LOC + CONTAIN + NOT_CONTAIN + NOOBJ + CLS  # 0.32515336


def test_hand_computed_example_running_normaliser():
    pred, target = hand_example()
    f = GtiLoss(1, 2)
    # first training call: nu = 0.9 * 6.25 + 0.1 * max(1 object, 1) / 1 image = 5.725
    t = f(pred, target)
    for k, want in (("loc", LOC), ("contain", CONTAIN), ("not_contain", NOT_CONTAIN),
                    ("noobj", NOOBJ), ("cls", CLS), ("total", SUM)):
        assert abs(t[k].item() - want / 5.725) < 1e-7, k
    assert abs(f.nu.item() - 5.725) < 1e-15
    # second: nu = 0.9 * 5.725 + 0.1 = 5.2525; a no-grad (validation) call does not move it
    assert abs(f(pred, target)["total"].item() - SUM / 5.2525) < 1e-7
    with torch.no_grad():
        assert abs(f(pred, target)["total"].item() - SUM / 5.2525) < 1e-7
    assert abs(f.nu.item() - 5.2525) < 1e-15
    assert "nu" in f.state_dict()
    # the same image twice: per-image means and per-image counts are unchanged
    g = GtiLoss(1, 2)
    assert abs(g(torch.cat([pred, pred]), torch.cat([target, target]))["total"].item()
               - SUM / 5.725) < 1e-7


def test_fixed_normaliser_and_weights():
    pred, target = hand_example()
    f = GtiLoss(1, 2, normalizer="fixed", normalizer_init=2.0, lambda_noobj=0.5, lambda_contain=0.0)
    for _ in range(2):
        t = f(pred, target)
        want = (LOC + NOT_CONTAIN + 0.5 * 0.025 + CLS) / 2.0
        assert abs(t["total"].item() - want) < 1e-7 and t["contain"].item() == 0
    assert f.nu.item() == 2.0


def test_iou_target_keeps_its_gradient_like_gti():
    pred, target = hand_example()
    for grad_through_iou in (True, False):
        p = pred.clone().requires_grad_()
        GtiLoss(1, 2, iou_target_grad=grad_through_iou)(p, target)["contain"].backward()
        # box 0's width enters the contain term only through its IoU target
        dw = p.grad[0, 2, 0, 1].item()
        assert (dw != 0) == grad_through_iou
        assert p.grad[0, 4, 0, 1].item() > 0  # conf 0.6 is above its IoU target: pushed down


def test_signed_sqrt_is_gti_for_positive_and_finite_below_zero():
    v = torch.tensor([0.0, 0.25, 0.36, -0.25], dtype=torch.float64, requires_grad=True)
    s = signed_sqrt(v)
    want = torch.tensor([1e-4, 0.5, 0.6, -0.5], dtype=torch.float64)
    assert torch.allclose(s, want, atol=1e-7)
    s.sum().backward()
    assert torch.isfinite(v.grad).all() and (v.grad > 0).all()


def test_errors_name_the_key():
    with pytest.raises(ValueError, match=r"^loss\.normalizer='ema' must be running or fixed$"):
        GtiLoss(3, normalizer="ema")
    with pytest.raises(ValueError, match=r"^loss\.lambda_noobj=nan must be a finite number >= 0$"):
        GtiLoss(3, lambda_noobj=float("nan"))
    with pytest.raises(ValueError, match=r"loss\.normalizer_init"):
        GtiLoss(3, normalizer_init=0)
    with pytest.raises(ValueError, match=r"^loss\.normalizer_momentum=1\.5 must be a number in \[0, 1\]$"):
        GtiLoss(3, normalizer_momentum=1.5)


def _loss_override(name: str) -> str:
    """``loss=<name>`` once conf/config.yaml lists the group in its defaults, ``+loss=`` before."""
    return ("loss=" if "loss" in compose(TINY) else "+loss=") + name


def test_loss_group_instantiates_with_todays_defaults():
    cfg = compose([*TINY, "trainer.device=cpu", _loss_override("default")])
    f = instantiate(cfg.loss)
    ref = YoloLoss(cfg.dataset.num_classes, cfg.model.net.boxes_per_cell)
    assert type(f) is YoloLoss and (f.C, f.B) == (ref.C, ref.B)
    assert (f.lambda_coord, f.lambda_obj, f.lambda_noobj, f.lambda_cls, f.beta, f.ignore_iou) == \
        (ref.lambda_coord, ref.lambda_obj, ref.lambda_noobj, ref.lambda_cls, ref.beta, ref.ignore_iou)
    cfg = compose([*TINY, "trainer.device=cpu", _loss_override("gti"), "loss.lambda_noobj=0.01"])
    g = instantiate(cfg.loss)
    assert type(g) is GtiLoss and g.lambda_noobj == 0.01 and g.lambda_coord == 5.0
    assert g.nu.item() == 6.25 and g.C == cfg.dataset.num_classes


def test_running_normaliser_is_split_invariant_under_ddp(tmp_path, monkeypatch):
    """World 1 x 4 images and world 2 x 2 images: the same nu every step, and the rank gradients
    (which DDP averages) are the world-1 gradient of the same images."""
    one = three_steps(0, 1)
    # the spawned ranks meet on loopback; monkeypatch: left in this process, it would reach the
    # jobs later tests submit (a two-node SLURM job then binds gloo to lo and cannot connect)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(rank_main, args=(2, str(tmp_path / "store"), str(tmp_path / "res")), nprocs=2)
    parts = [torch.load(tmp_path / f"res.{r}") for r in range(2)]
    for step in range(3):
        grad1, nu1 = one[step]
        for r in range(2):
            grad_r, nu_r = parts[r][step]
            assert torch.equal(nu_r, nu1)
            # DDP averages rank gradients: (1/2) * grad of the rank's loss = the share of world 1
            assert torch.allclose(grad_r / 2, grad1[2 * r:2 * r + 2], rtol=0, atol=1e-15)
