"""The alignment command and the checkpoint diff tool."""
from __future__ import annotations

import pytest
import torch

from mdk.tools import ckpt_diff
from launchers.align import alignment_config, validated_config, run_alignment
from helpers.ddp import TINY


def _tiny(tmp_path, *extra):
    return validated_config([*TINY, "dataset.generate.num_val=8", "dataset.generate.num_train=48",
                           f"paths.data={tmp_path}/data", *extra])


def test_alignment_config_switches_off_what_depends_on_the_split(tmp_path):
    cfg = _tiny(tmp_path, "trainer.amp=true")
    assert cfg.model.net.batch_norm is True
    a = alignment_config(cfg, 8, 5, "float32", tmp_path)  # all-reduce: the BN-free variant...
    assert a.model.net.batch_norm is False and a.dist.sync_bn is False
    s = alignment_config(_tiny(tmp_path, "dist.sync_bn=true"), 8, 5, "float64", tmp_path)
    assert s.model.net.batch_norm is True and s.dist.sync_bn is True  # ... or BN, synchronised
    e = alignment_config(cfg, 8, 5, "float32", tmp_path, exact_chunk=2)  # chunks: BN-free variant
    assert e.model.net.batch_norm is False and e.dist.exact_chunk == 2 and e.dist.cpu_threads == 1
    assert a.trainer.amp is False and a.trainer.batch_size == 8 and a.align.iters == 5
    assert cfg.model.net.batch_norm is True and cfg.trainer.amp is True  # input not mutated


@pytest.mark.ddp
@pytest.mark.slow
def test_world1_and_world2_train_the_same_weights(tmp_path):
    cfg = _tiny(tmp_path)
    report = run_alignment(cfg, [2], batch_size=8, iters=4, out=tmp_path / "al", noise_floor=1e-6)
    diffs = report[2]
    worst = max(d.max_rel for d in diffs)
    # the noise floor: world 1 again from init x (1 + 1e-6 N(0,1)); it moved, but stayed close
    floor = max(d.max_rel for d in report["floor"])
    assert 1e-8 < floor < 1e-3, floor
    # DDP's float32 all-reduce rounds its partial sums differently (~1e-7 per gradient, grown by
    # AdamW): world 2 must stay within that noise, i.e. closer to world 1 than a 1e-6 nudge of
    # the init gets (measured: 1.7e-6 against 9.3e-6; with one box per cell, 9.4e-7 against
    # 1.1e-5 with two). A real split bug (sampling, loss normalisation) is 1e-3 or more.
    assert worst <= floor and worst < 1e-5, ckpt_diff.format_table(diffs, 5)
    # ... and training really moved the weights (the comparison is not of two copies of init)
    init = torch.load(tmp_path / "al" / "init.pth")
    w1 = torch.load(tmp_path / "al" / "world1.pth")["model"]
    moved, _ = ckpt_diff.diff_state_dicts(init, w1)
    assert max(d.max_rel for d in moved) > 1e-3
    assert (tmp_path / "al" / "rank1.log").is_file()


def test_ckpt_diff_reports_and_exits_by_tolerance(tmp_path, capsys):
    a = {"w": torch.tensor([1.0, -2.0, 4.0]), "b": torch.zeros(2), "n": torch.tensor(3)}
    b = {"w": torch.tensor([1.0, -2.0, 4.0 + 4e-4]), "b": torch.zeros(2), "n": torch.tensor(3)}
    diffs, problems = ckpt_diff.diff_state_dicts(a, b)
    by = {d.name: d for d in diffs}
    assert not problems
    assert by["w"].max_abs == pytest.approx(4e-4, rel=1e-3)
    assert by["w"].max_rel == pytest.approx(1e-4, rel=1e-3)  # relative to the tensor's scale 4
    assert by["b"].max_rel == 0.0 and by["n"].max_abs == 0.0
    pa, pb, pc = tmp_path / "a.pth", tmp_path / "b.pth", tmp_path / "c.pth"
    torch.save({"model": a}, pa)
    torch.save({"model": b}, pb)
    torch.save({"model": {"w": torch.zeros(4)}}, pc)
    assert ckpt_diff.main([str(pa), str(pb), "--rtol", "1e-3"]) == 0
    assert ckpt_diff.main([str(pa), str(pb), "--rtol", "1e-5"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert ckpt_diff.main([str(pa), str(pb), "--rtol", "1", "--atol", "1e-5"]) == 1
    assert ckpt_diff.main([str(pa), str(pc)]) == 2
    out = capsys.readouterr().out
    assert "w: shape (3,) vs (4,)" in out and "b: only in the first" in out
    with pytest.raises(SystemExit, match="no 'optimizer' entry"):
        ckpt_diff.main([str(pa), str(pb), "--key", "optimizer"])


def test_perturb_scales_floating_tensors_only():
    from launchers.align import perturb

    state = {"w": torch.full((1000,), 2.0), "n": torch.tensor(7)}
    out = perturb(state, 1e-3, seed=3)
    rel = (out["w"] - 2.0) / 2.0
    assert 0.5e-3 < float(rel.std()) < 2e-3 and torch.equal(out["n"], state["n"])
    assert torch.equal(out["w"], perturb(state, 1e-3, seed=3)["w"])  # seeded
    assert torch.equal(state["w"], torch.full((1000,), 2.0))  # input untouched



@pytest.mark.ddp
@pytest.mark.slow
def test_sync_bn_model_aligns_in_float64_on_cpu(tmp_path):
    """The BN model itself on 1 vs 2 gloo processes with dist.sync_bn=true (mdk.sync_bn): after a
    step and after three, float64 weights agree to rounding. Conv biases feeding a BN get an exactly
    zero gradient in exact arithmetic, so they only ever hold rounding noise: checked absolutely."""
    cfg = _tiny(tmp_path, "dist.sync_bn=true", "optim=sgd")
    for iters in (1, 3):
        report = run_alignment(cfg, [2], batch_size=8, iters=iters, dtype="float64",
                               out=tmp_path / f"al{iters}")
        bias = [d for d in report[2] if d.name.endswith("conv.bias")]
        rest = [d for d in report[2] if not d.name.endswith("conv.bias")]
        assert any(d.name.endswith("bn.running_var") for d in rest)  # BN really is there
        assert max(d.max_rel for d in rest) <= 1e-11, ckpt_diff.format_table(rest, 5)
        assert max(d.max_abs for d in bias) <= 1e-13, ckpt_diff.format_table(bias, 5)
