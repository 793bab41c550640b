"""Choosing the mask bits of each major layer under a coefficient-memory budget, exactly
(docs/pipeline.md, Choosing mask widths under a memory budget).

Dynamic programming over the memory used: after each layer only the undominated plans are kept,
so the result equals a search over every combination at a cost that grows with the number of
distinct memory totals, not widths ** layers. No torch: it plans from saved sensitivities.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class PlanLayer:
    """One major layer: its coefficient count and its sensitivity at each width it may take."""

    weights: int
    sensitivity: Mapping[int, float]  # mask bits -> cost of quantizing this layer at that width


@dataclass(frozen=True)
class BitPlan:
    bits: tuple[int, ...]  # mask bits per major layer, in layer order
    sensitivity: float     # summed sensitivity of the plan
    memory_bits: int       # coefficient memory the plan takes, in bits


def memory_bits(layers: Sequence[PlanLayer], bits: Sequence[int]) -> int:
    """Coefficient memory of ``bits`` (one width per major layer), in bits."""
    return sum(layer.weights * b for layer, b in zip(layers, bits))


def plan_bits(layers: Sequence[PlanLayer], budget_bits: int) -> BitPlan:
    """The widths of least summed sensitivity whose coefficients fit ``budget_bits``.

    Ties go to less memory, then to narrower widths first in layer order (independent of dict
    order). ValueError when even the narrowest widths do not fit.
    """
    front = _front(layers, budget_bits)  # no layers: the empty plan
    used, (cost, bits) = min(front.items(), key=lambda kv: (kv[1][0], kv[0], kv[1][1]))
    return BitPlan(bits, cost, used)


def plan_within_cost(layers: Sequence[PlanLayer], max_cost: float) -> BitPlan:
    """The widths of least memory whose summed sensitivity is at most ``max_cost`` (e.g. the mAP
    a user accepts to lose); ties as :func:`plan_bits`. ValueError when no plan is that cheap."""
    if not layers:
        return BitPlan((), 0.0, 0)
    front = _front(layers, None)
    # A bound typed from a printed cost, or summed in another order (Python 3.12's sum()
    # compensates), can sit an ulp below the plan's own sum: that plan still fits.
    slack = 1e-9 * abs(max_cost)
    for used in sorted(front):
        cost, bits = front[used]
        if cost <= max_cost + slack:
            return BitPlan(bits, cost, used)
    least = min(cost for cost, _ in front.values())
    raise ValueError(f"no plan costs at most {max_cost:g}: the least sensitive plan costs "
                     f"{least:.6g}; raise the bound")


def _front(layers: Sequence[PlanLayer], budget_bits: int | None
           ) -> dict[int, tuple[float, tuple[int, ...]]]:
    """Memory used -> (sensitivity, widths) of every undominated whole plan within the budget
    (None: any memory), by dynamic programming over the layers."""
    for i, layer in enumerate(layers):
        if not layer.sensitivity:
            raise ValueError(f"major layer {i} has no width to choose from")
    front: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for layer in layers:
        nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
        for used, (cost, bits) in front.items():
            for b in sorted(layer.sensitivity):
                m = used + layer.weights * b
                if budget_bits is not None and m > budget_bits:
                    continue
                cand = (cost + float(layer.sensitivity[b]), bits + (b,))
                if m not in nxt or cand < nxt[m]:
                    nxt[m] = cand
        # Keep a plan only if every plan using less memory is strictly more sensitive: the rest can
        # never end better (the layers after add the same costs and memory to both).
        front, best = {}, float("inf")
        for used in sorted(nxt):
            if nxt[used][0] < best:
                front[used], best = nxt[used], nxt[used][0]
        if not front:
            narrow = sum(lay.weights * min(lay.sensitivity) for lay in layers)
            raise ValueError(f"a budget of {budget_bits} bits is below the narrowest plan's "
                             f"{narrow} bits; raise the budget")
    return front

