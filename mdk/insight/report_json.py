"""The report as data (``quant_report.json``) and as the table printed on stdout; the keys and
columns: docs/pipeline.md, "Finding where accuracy goes". An SQNR with no noise is null
(infinite). Nothing depends on the process count or time: the same checkpoints give the same file.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from mdk.insight.scoring import Score

FORMAT, VERSION = "mdk-quant-report", 2


def sensitivities(float_ref: Score, quantized: Score, only: Score, left: Score
                  ) -> dict[str, float]:
    """What quantizing a layer alone costs and leaving it alone float gains (+: it matters)."""
    return {"sensitivity_map": float_ref.map - only.map,
            "sensitivity_loss": only.loss - float_ref.loss,
            "left_float_map": left.map - quantized.map,
            "left_float_loss": quantized.loss - left.loss}


def ranking(layers: Sequence[Mapping[str, Any]]) -> list[int]:
    """Layer indices, worst first."""
    return [d["index"] for d in sorted(layers, key=lambda d: (-d["sensitivity_map"],
                                                              -d["sensitivity_loss"], d["index"]))]


def build_report(stages: Sequence[Mapping[str, Any]], layers: Sequence[dict[str, Any]],
                 subject: Optional[str], about: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON document; ``about``: metric, chip, split, image counts, float/quantized scores."""
    order = ranking(layers)
    rank = {i: k + 1 for k, i in enumerate(order)}
    return {"format": FORMAT, "version": VERSION, **about, "subject": subject,
            "stages": [dict(s) for s in stages],
            "layers": [{**d, "rank": rank[d["index"]]} for d in layers], "ranking": order}


def _f(v: Optional[float], spec: str) -> str:
    return "inf" if v is None else format(v, spec)


def table(report: Mapping[str, Any]) -> str:
    """The waterfall, then one row per layer in layer order with its rank (1 = worst)."""
    lines = [f"quantization report: {report['metric']}, split {report['split']!r} "
             f"({report['waterfall_images']} images), chip {report['chip']}",
             f"{'stage':<13} {'mAP':>7} {'loss':>8}  mode"]
    for s in report["stages"]:
        lines.append(f"{s['stage']:<13} {s['map']:7.4f} {s['loss']:8.4f}  {s['mode']}")
    if not report["layers"]:
        lines.append(f"no per-layer part: {report['per_layer_missing']}")
        return "\n".join(lines)
    f, q = report["float"], report["quantized"]
    lines += ["", f"per layer: {report['weights']}'s float weights (BN folded) at "
              f"{report['subject']}'s mask widths and caps, before fine-tuning; on the first "
              f"{report['sensitivity_images']} images float mAP {f['map']:.4f} loss "
              f"{f['loss']:.4f}, all quantized mAP {q['map']:.4f} loss {q['loss']:.4f}",
              f"{'layer':>5} {'bits':>4} {'shift':>5} {'cap':>7} {'w dB':>6} {'act iso':>7} "
              f"{'act cum':>7} {'clip %':>6} {'d mAP':>7} {'d loss':>7} {'fl mAP':>7} "
              f"{'fl loss':>7} {'rank':>4}"]
    for d in report["layers"]:
        lines.append(
            f"{d['index']:>5} {d['mask_bits']:>4} {d['shift']:>5} {d['cap']:7.3f} "
            f"{_f(d['weight_sqnr_db'], '6.1f'):>6} {_f(d['act_sqnr_db_isolated'], '7.1f'):>7} "
            f"{_f(d['act_sqnr_db_cumulative'], '7.1f'):>7} {100 * d['clipped_fraction']:6.2f} "
            f"{d['sensitivity_map']:+7.4f} {d['sensitivity_loss']:+7.4f} "
            f"{d['left_float_map']:+7.4f} {d['left_float_loss']:+7.4f} {d['rank']:>4}")
    lines.append("d mAP / d loss: only this layer quantized vs float (+: it costs); fl mAP / "
                 "fl loss: only this layer left float vs all quantized (+: it gains)")
    return "\n".join(lines)
