"""The quantization report as a stage's work (conf/step/quant_report.yaml; docs/pipeline.md,
"Finding where accuracy goes"). The work is a list of items, each done wholly by one rank with no
collective inside, so 1 and N processes write the same JSON; rank 0 gathers and writes it.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from mdk import dist
from mdk.atomic_file import write_json
from mdk.engine.context import StageContext
from mdk.errors import ConfigError
from mdk.eval.grid import save_png
from mdk.insight.layer_modes import mask_bits_of, measure_quantized
from mdk.insight.report_json import build_report, sensitivities, table
from mdk.insight.report_plot import render
from mdk.insight.scoring import EvalSet, score
from mdk.insight.sqnr import layer_table
from mdk.insight.stages import (PerLayer, Present, load_analysed, load_row, per_layer_of,
                                present_stages)
from mdk.sinks.build import build_sinks

log = logging.getLogger(__name__)

CHIP_MODEL_COST = 20  # the integer reference (int64 convs) against one fake-quant pass, measured
SQNR_COST = 3         # the SQNR item: a float pass, every layer alone, a quantized pass

Item = tuple  # ("stage", k) | ("float",) | ("quantized",) | ("only", i) | ("left", i) | ("sqnr",)


def share(costs: list[float], ranks: int) -> list[list[int]]:
    """Item indices per rank: the costliest item first to the least loaded rank (deterministic)."""
    load = [0.0] * ranks
    out: list[list[int]] = [[] for _ in range(ranks)]
    for k in sorted(range(len(costs)), key=lambda k: (-costs[k], k)):
        r = min(range(ranks), key=lambda r: (load[r], r))
        out[r].append(k)
        load[r] += costs[k]
    return [sorted(ks) for ks in out]


def quant_report(ctx: StageContext) -> Mapping[str, Any]:
    t0 = time.perf_counter()
    cfg, world = ctx.cfg, ctx.world
    n_sub = int(cfg.step.report.sensitivity_images)
    if n_sub < 1:
        raise ConfigError(f"step.report.sensitivity_images={n_sub} must be >= 1 (the first N val "
                          "images score each layer's sensitivity)")
    chip, grid = str(cfg.chip), int(ctx.model.grid)
    rows = present_stages(cfg, ctx.spec.name)
    part = per_layer_of(rows)
    full = EvalSet.from_config(cfg, ctx.val_ds, world.device)
    sub = EvalSet.from_config(cfg, ctx.val_ds, world.device, n_sub)
    cpu_full = EvalSet.from_config(cfg, ctx.val_ds, torch.device("cpu"))
    analysed = None if part.missing else load_analysed(cfg, part, grid).to(world.device)
    bits = mask_bits_of(analysed) if analysed is not None else {}

    items: list[Item] = [("stage", k) for k in range(len(rows))]
    if analysed is not None:
        items += [("float",), ("quantized",), ("sqnr",)]
        items += [(kind, i) for i in bits for kind in ("only", "left")]
    # each item's expected time, in images of one fake-quant pass
    costs = [full.images * (CHIP_MODEL_COST if rows[it[1]].is_chip_model else 1)
             if it[0] == "stage" else sub.images * (SQNR_COST if it[0] == "sqnr" else 1)
             for it in items]
    mine = share(costs, world.size)[world.rank]
    log.info("quantization report: %d items (%d on this rank), per layer: %s", len(items),
             len(mine), f"none: {part.missing}" if analysed is None else f"{part.weights.stage}'s "
             f"float weights (BN folded) at {part.subject.stage}'s mask widths and caps")

    def run(it: Item) -> Any:
        if it[0] == "stage":
            row = rows[it[1]]
            model = load_row(cfg, row, grid)
            if row.is_chip_model:  # the integer reference runs on the CPU
                return score(model, cpu_full)
            return score(model.to(world.device), full)
        assert analysed is not None
        if it[0] == "sqnr":
            loader = DataLoader(sub.dataset, batch_size=sub.batch_size)
            return layer_table(analysed, (images.to(sub.device) for images, _, _ in loader), chip)
        return measure_quantized(analysed, _quantized_layers(it, bits), sub, chip)

    done: dict[Item, Any] = {}
    for k in mine:
        t = time.perf_counter()
        done[items[k]] = run(items[k])
        log.info("  %s: %.1f s", items[k], time.perf_counter() - t)
    merged = {it: v for theirs in dist.all_gather_object(done) for it, v in theirs.items()}
    report = _assemble(rows, part, merged, full, sub, str(cfg.chip))
    if world.is_main:
        _write(ctx, report)
    log.info("quantization report done in %.1f s", time.perf_counter() - t0)
    return {"metric": report["metric"], "report": str(ctx.run_dir / "quant_report.json")}


def _quantized_layers(it: Item, bits: dict[int, int]) -> dict[int, int]:
    if it[0] == "float":
        return {}
    if it[0] == "only":
        return {it[1]: bits[it[1]]}
    if it[0] == "left":
        return {i: b for i, b in bits.items() if i != it[1]}
    return dict(bits)  # "quantized": every layer


def _assemble(rows: list[Present], part: PerLayer, merged: Mapping[Item, Any], full: EvalSet,
              sub: EvalSet, chip: str) -> dict[str, Any]:
    stages = [{"stage": r.stage, "mode": r.mode, **merged[("stage", k)].numbers()}
              for k, r in enumerate(rows)]
    layers: list[dict[str, Any]] = []
    about: dict[str, Any] = {"metric": merged[("stage", 0)].metric, "chip": chip,
                             "split": str(full.dataset.split), "waterfall_images": full.images,
                             "sensitivity_images": 0 if part.missing else sub.images,
                             "weights": part.weights and part.weights.stage,
                             "per_layer_missing": part.missing}
    if part.missing is None:
        f, q = merged[("float",)], merged[("quantized",)]
        about.update(float=f.numbers(), quantized=q.numbers())
        layers = [{**d, **sensitivities(f, q, merged[("only", d["index"])],
                                        merged[("left", d["index"])])} for d in merged[("sqnr",)]]
    return build_report(stages, layers, part.subject and part.subject.stage, about)


def _write(ctx: StageContext, report: dict[str, Any]) -> None:
    out = ctx.run_dir
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "quant_report.json", report, indent=2)
    text = table(report)
    (out / "quant_report.txt").write_text(text + "\n")
    image = render(report)
    save_png(image, out / "quant_report.png")
    print(text, flush=True)
    print(f"wrote {out / 'quant_report.json'}, quant_report.png, quant_report.txt", flush=True)
    sink = build_sinks(ctx.cfg.logger, out, OmegaConf.to_container(ctx.cfg, resolve=True),
                       True, stage=ctx.spec.name, group=ctx.group)
    try:
        for k, s in enumerate(report["stages"]):
            sink.log({"quant_report/stage_map": s["map"], "quant_report/stage_loss": s["loss"]}, k)
        for d in report["layers"]:
            sink.log({f"quant_report/{key}": d[key] for key in (
                "weight_sqnr_db", "act_sqnr_db_isolated", "act_sqnr_db_cumulative",
                "clipped_fraction", "sensitivity_map", "sensitivity_loss") if d[key] is not None},
                d["index"])
        sink.log_image("quant_report/figure", image, 0)
        sink.log_text("quant_report/table", "```\n" + text + "\n```", 0)
    finally:
        sink.close()
