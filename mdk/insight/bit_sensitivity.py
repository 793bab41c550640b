"""What each mask width of each major layer costs: the measurements a bit plan is chosen from.

A major layer (a run of chip layers up to a max-pool) has one mask width. Its cost is taken on the
float weights, BN folded, with only its weights quantized; ``by`` says how (``BY``; what each
measures: docs/pipeline.md, "Choosing mask widths under a memory budget").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from mdk.insight.layer_modes import measure_quantized, quantized_only
from mdk.insight.scoring import EvalSet, Score
from mdk.quant.bit_plan import PlanLayer
from mdk.quant.bn_fold import chip_layers
from mdk.quant.chips import CHIP_BITS, chip_bits
from mdk.quant.weights import quantize_conv

BY = ("loss", "map", "fisher")


def pool_groups(model: nn.Module) -> list[list[int]]:
    """The chip layers' indices grouped by their pools (each group ends at a pool or the end):
    the major layers a width plan gives one width each (the GTI SDK's own grouping also splits
    where mask widths change: mdk.quant.gti_sdk.sdk_major_layers)."""
    groups: list[list[int]] = [[]]
    for i, layer in enumerate(chip_layers(model)):
        groups[-1].append(i)
        if layer.pool:
            groups.append([])
    return [g for g in groups if g]


def coefficients(model: nn.Module, group: Sequence[int]) -> int:
    """Weight coefficients of the layers in ``group`` (what their mask widths are paid for)."""
    layers = chip_layers(model)
    return sum(layers[i].conv.weight.numel() for i in group)


def memory_of(model: nn.Module, mask_bits: Sequence[int]) -> int:
    """Coefficient memory, in bits, of ``mask_bits`` (one width per chip layer)."""
    return sum(layer.conv.weight.numel() * int(b)
               for layer, b in zip(chip_layers(model), mask_bits, strict=True))


def chip_widths(chip: str) -> list[int]:
    return sorted(CHIP_BITS[str(chip)])


@dataclass(frozen=True)
class WidthCosts:
    groups: list[list[int]]
    reference: Score
    costs: list[dict[int, float]]  # per major layer: width -> cost
    by: str
    scores: list[dict[int, Score]] = field(default_factory=list)  # measured (loss, map): the scores

    def major(self, model: nn.Module) -> list[PlanLayer]:
        """The planner's input (mdk.quant.bit_plan)."""
        return [PlanLayer(coefficients(model, g), dict(self.costs[k]))
                for k, g in enumerate(self.groups)]


def fisher_diagonal(model: nn.Module, data: EvalSet, chip: str) -> list[torch.Tensor]:
    """Per chip layer, the mean squared gradient of the training loss w.r.t. its conv weight over
    ``data``'s batches, the model float and in eval mode."""
    layers = chip_layers(model)
    weights = [layer.conv.weight for layer in layers]
    sums = [torch.zeros_like(w) for w in weights]
    frozen = [not w.requires_grad for w in weights]
    was_training, batches = model.training, 0
    model.eval()
    try:
        for w in weights:
            w.requires_grad_(True)
        with quantized_only(model, {}, chip), torch.enable_grad():  # every layer float
            for images, targets, _ in DataLoader(data.dataset, batch_size=data.batch_size):
                pred = model(images.to(data.device))
                loss = data.loss_fn(pred, targets.to(data.device))["total"]
                for acc, g in zip(sums, torch.autograd.grad(loss, weights)):
                    acc.add_(g.detach().square())
                batches += 1
    finally:
        for w, off in zip(weights, frozen):
            w.requires_grad_(not off)
        model.train(was_training)
    return [acc / max(batches, 1) for acc in sums]


def fisher_cost(layer: nn.Module, fisher: torch.Tensor, bits: int, chip: str) -> float:
    """``1/2 sum F (Q(w) - w)^2`` of one chip layer's weights at ``bits`` on ``chip``."""
    w = layer.conv.weight.detach()
    wq, _ = quantize_conv(w, layer.conv.bias.detach(), bits, *chip_bits(chip, bits))
    return 0.5 * float((fisher * (wq - w).square()).sum())


def width_costs(model: nn.Module, chip: str, data: EvalSet, by: str = "loss") -> WidthCosts:
    """The cost of every (major layer, chip width) on ``data`` ``by`` one of ``BY``, and the float
    model's score."""
    if by not in BY:
        raise ValueError(f"by={by!r}: measure the cost by one of {BY}")
    groups = pool_groups(model)
    reference = measure_quantized(model, {}, data, chip)
    if by == "fisher":
        fisher, layers = fisher_diagonal(model, data, chip), chip_layers(model)
        costs = [{b: sum(fisher_cost(layers[i], fisher[i], b, chip) for i in g)
                  for b in chip_widths(chip)} for g in groups]
        return WidthCosts(groups, reference, costs, by)
    scores = [{b: measure_quantized(model, {i: b for i in g}, data, chip, activations=False)
               for b in chip_widths(chip)} for g in groups]
    costs = [{b: s.loss - reference.loss if by == "loss" else reference.map - s.map
              for b, s in per_width.items()} for per_width in scores]
    return WidthCosts(groups, reference, costs, by, scores)
