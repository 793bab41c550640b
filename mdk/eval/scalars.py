"""An evaluator's result as flat labelled scalars (for sinks, result.json) and a text table."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence


def _class_name(names: Optional[Sequence[str]], c: int) -> str:
    return str(names[c]) if names is not None and c < len(names) else str(c)


def scalars(result: dict[str, Any], class_names: Optional[Sequence[str]] = None,
            per_class: bool = True) -> dict[str, float]:
    """Flat ``{key: value}``: the headline (``map50_voc07``, ``map50_voc12``, ``map_coco``),
    ``map50_coco`` for COCO, and with ``per_class`` one AP per class with ground truth."""
    metric = result["metric"]
    if metric == "coco":
        out = {"map_coco": result["map"], "map50_coco": result["map50"]}
    else:
        out = {f"map50_{metric}": result["map"]}
    if per_class:
        prefix = "ap_coco" if metric == "coco" else f"ap50_{metric}"
        for c, v in enumerate(result["ap"]):
            if not math.isnan(float(v)):
                out[f"{prefix}/{_class_name(class_names, c)}"] = float(v)
    return out


def ap_table(result: dict[str, Any], class_names: Optional[Sequence[str]] = None) -> str:
    """A Markdown table of the per-class APs (renders in TensorBoard, reads as text in a log)."""
    coco = result["metric"] == "coco"
    head = "| class | AP50:95 | AP50 | objects | detections |" if coco else \
        "| class | AP50 | objects | detections |"
    lines = [f"{result['name']} over {result['images']} images", "", head,
             "|---" * (5 if coco else 4) + "|"]

    def fmt(v: float) -> str:
        return "n/a" if math.isnan(float(v)) else f"{float(v):.4f}"

    for c in range(len(result["ap"])):
        cells = [_class_name(class_names, c), fmt(result["ap"][c])]
        if coco:
            cells.append(fmt(result["ap50"][c]))
        cells += [str(int(result["num_gt"][c])), str(int(result["num_det"][c]))]
        lines.append("| " + " | ".join(cells) + " |")
    mean = ["**mean**", fmt(result["map"])] + ([fmt(result["map50"])] if coco else []) + ["", ""]
    lines.append("| " + " | ".join(mean) + " |")
    lines += ["", "n/a: no ground truth of this class in the evaluated images (left out of the "
              "mean)."]
    return "\n".join(lines)
