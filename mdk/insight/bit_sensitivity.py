"""What each mask width of each major layer costs: the measurements a bit plan is chosen from.

A major layer is a run of chip layers up to and including a max-pool (the layers after the last
pool form the last one): the chip quantizes it with one mask width. Its cost at width ``b`` is
measured on float weights (a step1 checkpoint, BN folded) with only that major layer's weights
quantized at ``b``, every other layer and every activation float: the widths change only the
weights, and the 5-bit activations cost the same whatever the widths are, so they are left out of
the choice. The cost is the change of the val loss (``by="loss"``, smooth on few images) or the
mAP lost (``by="map"``) against the float model on the same images.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ContextManager, Mapping, Sequence

from torch import nn

from mdk.insight.layer_modes import quantized_only
from mdk.insight.scoring import Score
from mdk.quant.bit_plan import MajorLayer
from mdk.quant.bn_fold import chip_layers
from mdk.quant.chips import CHIP_BITS

BY = ("loss", "map")


def major_layers(model: nn.Module) -> list[list[int]]:
    """The chip layers' indices grouped into major layers: each group ends at a pooling layer,
    and the layers after the last pool are the last group."""
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
    """The mask widths ``chip`` supports, narrowest first."""
    return sorted(CHIP_BITS[str(chip)])


def weights_quantized(model: nn.Module, mask_bits: Mapping[int, int], chip: str
                      ) -> ContextManager[nn.Module]:
    """``model`` with only the weights of the layers in ``mask_bits`` quantized, at those widths
    on ``chip``; everything else float, activations included (put back afterwards)."""
    return quantized_only(model, mask_bits, chip, activations=False)


@dataclass(frozen=True)
class WidthCosts:
    """The measured costs, with the float reference they are taken against."""
    groups: list[list[int]]
    reference: Score
    scores: list[dict[int, Score]]  # per major layer: width -> score with only it quantized
    by: str

    def cost(self, group: int, width: int) -> float:
        s = self.scores[group][width]
        return s.loss - self.reference.loss if self.by == "loss" else self.reference.map - s.map

    def major(self, model: nn.Module) -> list[MajorLayer]:
        """The planner's input (mdk.quant.bit_plan)."""
        return [MajorLayer(coefficients(model, g), {b: self.cost(k, b) for b in self.scores[k]})
                for k, g in enumerate(self.groups)]


def width_costs(model: nn.Module, chip: str, scorer: Callable[[nn.Module], Score],
                by: str = "loss") -> WidthCosts:
    """Score ``model`` (float weights) once as it is and once per (major layer, chip width) with
    only that major layer's weights quantized at that width."""
    if by not in BY:
        raise ValueError(f"by={by!r}: measure the cost by one of {BY}")
    groups = major_layers(model)
    with weights_quantized(model, {}, chip):
        reference = scorer(model)
    scores = []
    for g in groups:
        per_width = {}
        for b in chip_widths(chip):
            with weights_quantized(model, {i: b for i in g}, chip):
                per_width[b] = scorer(model)
        scores.append(per_width)
    return WidthCosts(groups, reference, scores, by)
