"""Choose the mask width of each major layer under a coefficient-memory budget.

    python -m mdk.tools.plan_bits budget_kb=900 [overrides]
    python -m mdk.tools.plan_bits max_cost=0.02 by=map  # the least memory losing <= 0.02 mAP

Tool keys (one of ``budget_kb``, ``budget``, ``max_cost``; ``images``, ``by``, ``out``) are taken
off the command line; every other argument is a config override, composed as ``python run.py``.
What it measures and writes: docs/pipeline.md, "Choosing mask widths under a memory budget".
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from mdk.atomic_file import write_json
from mdk.compose import compose
from mdk.errors import ToolError, error_line
from mdk.engine.build import build_data
from mdk.insight.bit_sensitivity import (BY, WidthCosts, chip_widths, memory_of, width_costs)
from mdk.insight.scoring import EvalSet
from mdk.quant.bit_plan import BitPlan, PlanLayer, plan_bits, plan_within_cost
from mdk.quant.bn_fold import chip_layers
from mdk.quant.modes import QuantMode, apply_mode
from mdk.stage import chain, stage_conf, stage_names
from mdk.checkpoint.layout import BEST, checkpoint_root
from mdk.tools.evaluate import Loaded, tool_config, load_checkpoint_model

TOOL_KEYS = {"budget_kb": None, "budget": None, "max_cost": None, "images": "200", "by": "loss",
             "out": None}
LIMITS = ("budget_kb", "budget", "max_cost")
KIB = 8192  # bits
UNITS = {"loss": "val loss increase", "map": "mAP lost",
         "fisher": "val loss increase predicted from the Fisher diagonal"}


def split_args(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """(tool keys, config overrides) of the command line."""
    keys, overrides = dict(TOOL_KEYS), []
    for a in argv:
        name, _, value = a.partition("=")
        if name in TOOL_KEYS:
            keys[name] = value
        else:
            overrides.append(a)
    if sum(keys[k] is not None for k in LIMITS) != 1:
        raise ToolError("give one of budget_kb=<KiB> (the coefficient memory the plan may use; "
                        "budget_kb=current: what the model's widths take today), budget=<fraction "
                        "of what today's widths take>, e.g. budget=0.75, or max_cost=<the summed "
                        "cost the plan may have>, e.g. max_cost=0.02 by=map")
    if keys["max_cost"] is not None:
        try:
            bound = float(keys["max_cost"])
        except ValueError:
            bound = float("nan")
        if not bound >= 0:
            raise ToolError(f"max_cost={keys['max_cost']!r} must be a number >= 0 (in the cost's "
                            "unit: mAP lost with by=map)")
    if keys["by"] not in BY:
        raise ToolError(f"by={keys['by']!r}: measure the cost by one of {', '.join(BY)}")
    if not keys["images"].isdigit() or int(keys["images"]) < 1:
        raise ToolError(f"images={keys['images']!r} must be a whole number >= 1 (val images scored)")
    return keys, overrides


def float_checkpoint(cfg: Any) -> Path:
    """best.pth of the last float training stage that has one under paths.checkpoints."""
    root = checkpoint_root(cfg)
    floats = [s for s in stage_names() if stage_conf(s).trains and stage_conf(s).quant.is_float]
    for s in sorted(floats, key=lambda s: -len(chain(s))):
        if (root / s / BEST).is_file():
            return root / s / BEST
    raise ToolError(f"no float checkpoint under paths.checkpoints={root} (looked for "
                    f"{', '.join(f'{s}/{BEST}' for s in floats)}); train it first, e.g. python "
                    f"run.py step={floats[0] if floats else '...'} with the same overrides")


def budget_bits(keys: dict[str, str], loaded: Loaded) -> int | None:
    """The budget in bits (None: ``max_cost`` bounds the plan instead)."""
    if keys["max_cost"] is not None:
        return None
    bits = [int(layer.mask_bits) for layer in chip_layers(loaded.model)]
    if keys["budget"] is not None:
        try:
            fraction = float(keys["budget"])
        except ValueError:
            fraction = float("nan")
        if not fraction > 0:
            raise ToolError(f"budget={keys['budget']!r} must be a fraction > 0 of the memory "
                            "today's widths take (budget=0.75: three quarters of it)")
        return int(fraction * memory_of(loaded.model, bits))
    value = keys["budget_kb"]
    if value == "current":
        return memory_of(loaded.model, bits)
    try:
        kb = float(value)
    except ValueError:
        raise ToolError(f"budget_kb={value!r} must be a number of KiB or 'current'") from None
    if not kb > 0:
        raise ToolError(f"budget_kb={value} must be > 0")
    return int(kb * KIB)


def report(costs: WidthCosts, major: list[PlanLayer], plan: BitPlan, widths: list[int],
           budget: int | None, meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "by": costs.by, "budget_bits": budget, "memory_bits": plan.memory_bits,
            "reference": costs.reference.numbers(), "widths": widths,
            "major_layers": [{"layers": g, "weights": m.weights,
                              "cost": {str(b): m.sensitivity[b] for b in widths},
                              **({"score": {str(b): costs.scores[k][b].numbers() for b in widths}}
                                 if costs.scores else {}),
                              "mask_bits": plan.bits[k]}
                             for k, (g, m) in enumerate(zip(costs.groups, major))],
            "cost": plan.sensitivity,
            "mask_bits": [b for g, b in zip(costs.groups, plan.bits) for _ in g]}


def table(doc: dict[str, Any]) -> str:
    widths = doc["widths"]
    unit = UNITS[doc["by"]]
    lines = [f"cost of each width ({unit} on {doc['images']} val images; float: mAP "
             f"{doc['reference']['map']:.4f}, loss {doc['reference']['loss']:.4f}):",
             "major  layers        weights  " + "  ".join(f"{b:>2}-bit cost" for b in widths)
             + "  plan"]
    for k, m in enumerate(doc["major_layers"]):
        span = f"{m['layers'][0]}-{m['layers'][-1]}" if len(m["layers"]) > 1 else f"{m['layers'][0]}"
        lines.append(f"{k:>5}  {span:<12}  {m['weights']:>7}  "
                     + "  ".join(f"{m['cost'][str(b)]:>+11.4f}" for b in widths)
                     + f"  {m['mask_bits']:>2}-bit")
    lines.append(f"plan: summed cost {doc['cost']:+.4f}, coefficients {doc['memory_bits'] / KIB:.1f} "
                 + (f"KiB of the budget's {doc['budget_bits'] / KIB:.1f} KiB"
                    if doc["budget_bits"] is not None else
                    f"KiB, the least for a summed cost <= {doc['max_cost']:g}"))
    lines.append("model.net.mask_bits=[" + ",".join(map(str, doc["mask_bits"])) + "]")
    return "\n".join(lines)


def run_dir(overrides: Sequence[str]) -> Path:
    """The run dir ``python run.py`` would use with ``overrides`` (``hydra.run.dir``)."""
    return Path(str(compose(list(overrides), hydra_config=True).hydra.run.dir))


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        keys, overrides = split_args(sys.argv[1:] if argv is None else argv)
        path = float_checkpoint(tool_config(overrides))
        loaded = load_checkpoint_model(path, overrides)
        chip = str(loaded.cfg.chip)
        budget = budget_bits(keys, loaded)
        apply_mode(loaded.model, QuantMode(fold_bn=True), chip, "plan_bits")  # the chip has no BN
        _, val = build_data(loaded.cfg, loaded.model.grid, train=False)  # scored ~19 times: cached
        data = EvalSet.from_config(loaded.cfg, val, loaded.device, images=int(keys["images"]))
        costs = width_costs(loaded.model, chip, data, keys["by"])
        major = costs.major(loaded.model)
        given = next(k for k in LIMITS if keys[k] is not None)
        bound = None if budget is not None else float(keys["max_cost"])
        try:
            plan = plan_bits(major, budget) if bound is None else plan_within_cost(major, bound)
        except ValueError as e:
            raise ToolError(f"{given}={keys[given]}: {e}") from None
        meta = {"checkpoint": str(path), "chip": chip, "images": data.images}
        if bound is not None:
            meta["max_cost"] = bound
        doc = report(costs, major, plan, chip_widths(chip), budget, meta)
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a user error of the library (config, data, checkpoint): one line
        line = error_line(e)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    out = write_json(keys["out"] or run_dir(overrides) / "plan_bits.json", doc, indent=2)
    print(table(doc))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
