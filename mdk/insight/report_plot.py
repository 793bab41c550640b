"""``quant_report.png``: the stage waterfall, the per-layer SQNRs and the per-layer sensitivity,
drawn with matplotlib's Agg canvas (``Figure`` directly, never pyplot: no global state)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch


def render(report: Mapping[str, Any]) -> torch.Tensor:
    """The figure as a uint8 ``[3, H, W]`` image (for a PNG and the metric sinks)."""
    # matplotlib here: slow to import, needed only when the report is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    layers = report["layers"]
    fig = Figure(figsize=(11, 9 if layers else 3.5), dpi=100)
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(3 if layers else 1, 1, squeeze=False)[:, 0]
    names = [s["stage"] for s in report["stages"]]
    maps = [s["map"] for s in report["stages"]]
    ax = axes[0]
    bars = ax.bar(names, maps, color="tab:blue")
    ax.bar_label(bars, labels=[f"{m:.3f}" for m in maps], fontsize=8)
    ax.set_ylabel("mAP")
    ax.set_title(f"{report['metric']} on {report['waterfall_images']} {report['split']} images",
                 fontsize=10)
    if layers:
        idx = np.array([d["index"] for d in layers])
        ax = axes[1]
        for key, label, shift in (("weight_sqnr_db", "weights", -0.27),
                                  ("act_sqnr_db_isolated", "activation, isolated", 0.0),
                                  ("act_sqnr_db_cumulative", "activation, cumulative", 0.27)):
            vals = [np.nan if d[key] is None else d[key] for d in layers]
            ax.bar(idx + shift, vals, width=0.27, label=label)
        ax.set_ylabel("SQNR (dB)")
        ax.set_title(f"per layer: {report['weights']}'s weights at {report['subject']}'s widths "
                     "and caps (higher is better)", fontsize=10)
        ax.legend(fontsize=8)
        ax.set_xticks(idx)
        ax = axes[2]
        ax.bar(idx - 0.2, [d["sensitivity_map"] for d in layers], width=0.4,
               label="mAP drop, only this layer quantized")
        ax.bar(idx + 0.2, [d["left_float_map"] for d in layers], width=0.4,
               label="mAP gain, only this layer float")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(idx)
        ax.set_xlabel("chip layer")
        ax.set_ylabel("mAP")
        ax.set_title(f"sensitivity on the first {report['sensitivity_images']} images; worst "
                     f"first: {report['ranking'][:5]}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    return torch.from_numpy(np.ascontiguousarray(rgba[..., :3].transpose(2, 0, 1)))
