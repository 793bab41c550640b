"""Calibration observers: exact nearest-rank percentile, max/MSE options, caps file."""
import json

import numpy as np
import pytest
import torch

from mdk.models.gnetdet import GNetDet
from mdk.quant import calibrate
from mdk.quant.cal_stats import mse_cap, nearest_rank, percentile_and_max
from mdk.quant.calibrate import MaxCap, MseCap, PercentileCap
from mdk.stage import apply_stage


@pytest.mark.parametrize("n", [1, 7, 100, 1001, 300_000, 2_000_003])
@pytest.mark.parametrize("p", [99.0, 99.9, 50.0, 100.0, 0.5])
def test_percentile_matches_sorted_reference(n, p):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 2 + 0.3
    k = max(1, -(-(round(p * 1000) * n) // 100_000))  # ceil(p/100 * n) in integers
    want = np.sort(x.numpy())[k - 1]
    assert float(percentile_and_max(x, p)[0]) == float(want)
    if (round(p * 1000) * n) % 100_000:  # numpy agrees unless p*n/100 is an integer, where its
        # float product can land just above it (e.g. 0.999 * 300000) and take the next value
        assert float(want) == float(np.percentile(x.numpy(), p, method="inverted_cdf"))


def test_percentile_exact_on_adversarial_layout():
    # sorted data defeats the strided sample's threshold: the exact fallback must kick in
    x = torch.arange(1_000_000, dtype=torch.float32).flip(0).reshape(10, 100, 1000)
    assert float(percentile_and_max(x, 99)[0]) == float(
        np.percentile(x.numpy(), 99, method="inverted_cdf"))
    assert nearest_rank(99, 1_000_000) == 990_000 and nearest_rank(99, 101) == 100


def test_large_tensors_use_documented_odd_stride_subsample():
    g = torch.Generator().manual_seed(4)
    y = torch.randn(4, 8, 96, 96, generator=g)  # 294912 values
    sub = y.flatten()[::5]  # ceil(294912 / 65536) = 5, already odd
    def subsample(x, max_values):  # what one process's observer reads
        return PercentileCap(99, max_values=max_values).sample(x)

    assert torch.equal(subsample(y, 1 << 16), sub)
    assert torch.equal(subsample(y, 1 << 17)[:3], y.flatten()[[0, 3, 6]])  # 3 -> odd 3
    assert subsample(y, None).numel() == y.numel()
    obs = PercentileCap(99, max_values=1 << 16)
    obs(y)
    assert float(obs.stat) == float(np.sort(sub.numpy())[nearest_rank(99, sub.numel()) - 1])
    full = PercentileCap(99, max_values=None)
    full(y)
    assert float(full.stat) == float(np.sort(y.flatten().numpy())[nearest_rank(99, y.numel()) - 1])
    assert abs(float(obs.stat) - float(full.stat)) < 0.05  # the subsample barely moves the cap


def test_observer_max_over_batches_and_methods():
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(2, 4, 32, 32, generator=g) * s for s in (1.0, 3.0, 2.0)]
    obs = PercentileCap(99)
    for b in batches:
        obs(b)
    want = max(np.percentile(b.numpy(), 99, method="inverted_cdf") for b in batches)
    assert float(obs.stat) == float(want)
    assert float(obs.top) == max(float(b.max()) for b in batches)
    mx = MaxCap()
    for b in batches:
        mx(b)
    assert float(mx.stat) == max(float(b.max()) for b in batches)
    mse = MseCap()
    for b in batches:
        mse(b)
    assert 0 < float(mse.stat) <= float(mx.stat)
    with pytest.raises(ValueError, match="percentile=0"):
        PercentileCap(0)
    with pytest.raises(ValueError, match="mse_candidates=0"):
        MseCap(0)


def test_mse_cap_beats_max_and_tiny_caps():
    g = torch.Generator().manual_seed(2)
    y = torch.randn(200_000, generator=g).exp()  # heavy right tail: the max is a poor cap
    cap = mse_cap(y, 64)
    r = y.clamp_min(0)

    def err(c):
        from mdk.quant.activation import quantize_activation

        return float((quantize_activation(r, c) - r).pow(2).mean())
    assert err(cap) < err(r.max()) and err(cap) < err(r.max() / 20)


def _tiny_model():
    torch.manual_seed(0)
    return GNetDet(num_classes=3, channels=[8, "M", 8, "M", 16, "M", 16], mask_bits=[3, 3, 3, 8, 8],
                   image_size=32, batch_norm=True)


class _Tee:
    def __init__(self, obs, store):
        self.obs, self.store = obs, store

    def __call__(self, y):
        self.store.append(y.clone())
        self.obs(y)


def test_attach_finalize_save_caps(tmp_path):
    model = _tiny_model().eval()
    apply_stage(model, "cal", "5801")
    images = [torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8) for _ in range(3)]
    with pytest.raises(RuntimeError, match="saw no calibration batch"):
        with calibrate.observing(model):
            calibrate.finalize_caps(model)
    # independent reference: tee each layer's pre-activation output into a list
    seen = {i: [] for i in range(len(model.layers))}
    with calibrate.observing(model, lambda: PercentileCap(99.0)), torch.no_grad():
        for i, layer in enumerate(model.layers):
            layer.observer = _Tee(layer.observer, seen[i])
        for im in images:
            model(im)
        for layer in model.layers:
            layer.observer = layer.observer.obs
        caps = calibrate.finalize_caps(model)
    assert all(layer.observer is None for layer in model.layers)
    for i, c in enumerate(caps):
        want = max(np.percentile(y.numpy(), 99, method="inverted_cdf") for y in seen[i])
        want = want if want > 0 else max(float(y.max()) for y in seen[i])
        assert c == float(want), i
        assert float(model.layers[i].cap) == c
    path = calibrate.save_caps(model, tmp_path / "caps.json", meta={"method": "percentile"})
    doc = json.loads(path.read_text())
    assert [e["cap"] for e in doc["layers"]] == caps and doc["meta"]["method"] == "percentile"


def test_nonpositive_statistic_falls_back():
    model = _tiny_model().eval()
    apply_stage(model, "cal", "5801")
    with calibrate.observing(model) as obs:
        for o in obs:
            o(torch.full((4, 4), -1.0))
        obs[0](torch.tensor([-5.0, 0.25]))
        caps = calibrate.finalize_caps(model)
    assert caps[0] == 0.25 and caps[1] == 1.0


def test_percentile_top_k_form_equals_kthvalue():
    """The GPU form (smallest of the n - k + 1 largest) picks the same value as kthvalue."""
    g = torch.Generator().manual_seed(7)
    for n, p in ((1000, 99.0), (4097, 99.9), (300_000, 99.0), (10, 50.0)):
        x = torch.randn(n, generator=g).round(decimals=2)  # ties included
        k = nearest_rank(p, n)
        top = x.topk(n - k + 1, sorted=False).values
        assert top.min() == x.kthvalue(k).values and top.max() == x.max()
