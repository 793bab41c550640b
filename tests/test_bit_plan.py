"""The bit-width planner (mdk/quant/bit_plan.py) against a search over every combination."""
from __future__ import annotations

import functools
import itertools
import math
import operator
import random

import pytest

from mdk.quant.bit_plan import PlanLayer, memory_bits, plan_bits, plan_within_cost
from mdk.quant.chips import CHIP_BITS


def brute_force(layers: list[PlanLayer], budget: int) -> tuple[float, int, tuple[int, ...]]:
    """(sensitivity, memory, widths) of the best plan that fits, by trying every combination,
    with the planner's tie rule: less memory, then narrower widths first in layer order."""
    best = None
    for bits in itertools.product(*(sorted(layer.sensitivity) for layer in layers)):
        mem = memory_bits(layers, bits)
        if mem > budget:
            continue
        cost = 0.0
        for layer, b in zip(layers, bits):
            cost += float(layer.sensitivity[b])
        key = (cost, mem, bits)
        if best is None or key < best:
            best = key
    return best


def brute_force_within(layers: list[PlanLayer], max_cost: float
                       ) -> tuple[int, float, tuple[int, ...]] | None:
    """(memory, sensitivity, widths) of the least-memory plan costing at most ``max_cost``."""
    best = None
    for bits in itertools.product(*(sorted(layer.sensitivity) for layer in layers)):
        cost = 0.0
        for layer, b in zip(layers, bits):
            cost += float(layer.sensitivity[b])
        key = (memory_bits(layers, bits), cost, bits)
        if cost <= max_cost and (best is None or key < best):
            best = key
    return best


def random_net(rng: random.Random) -> list[PlanLayer]:
    """1-8 major layers of one chip's widths; a wider width costs less, now and then two widths
    cost the same (ties)."""
    chip = rng.choice(sorted(CHIP_BITS))
    widths = sorted(CHIP_BITS[chip])
    layers = []
    for _ in range(rng.randint(1, 8)):
        costs = sorted((round(rng.uniform(0, 0.05), rng.choice([2, 6])) for _ in widths),
                       reverse=True)
        layers.append(PlanLayer(weights=rng.choice([27, 144, 576, 1152, 2304, 4608]),
                                 sensitivity=dict(zip(widths, costs))))
    return layers


@pytest.mark.parametrize("seed", range(40))
def test_the_least_memory_under_a_cost_bound_equals_brute_force(seed: int) -> None:
    rng = random.Random(1000 + seed)
    layers = random_net(rng)
    # summed left to right as the plan and the brute force sum: Python 3.12's sum() compensates,
    # which can land an ulp below that, and then the cheapest plan would not fit its own cost
    widest = functools.reduce(operator.add, (min(layer.sensitivity.values()) for layer in layers))
    narrowest = functools.reduce(operator.add, (max(layer.sensitivity.values()) for layer in layers))
    for bound in (widest, (widest + narrowest) / 2, rng.uniform(widest, narrowest), narrowest):
        plan = plan_within_cost(layers, bound)
        assert (plan.memory_bits, plan.sensitivity, plan.bits) == brute_force_within(layers, bound)
        assert plan.sensitivity <= bound
    with pytest.raises(ValueError, match="no plan costs at most"):
        plan_within_cost(layers, widest - 0.01)
    # the cheapest plan's cost summed another way (compensated, as 3.12's sum()) still admits it
    assert plan_within_cost(layers, math.fsum(min(la.sensitivity.values()) for la in layers)
                            ).bits == plan_within_cost(layers, widest).bits


@pytest.mark.parametrize("seed", range(40))
def test_equals_brute_force_on_random_nets(seed: int) -> None:
    rng = random.Random(seed)
    layers = random_net(rng)
    widths = sorted(layers[0].sensitivity)
    narrow = memory_bits(layers, [widths[0]] * len(layers))
    wide = memory_bits(layers, [widths[-1]] * len(layers))
    for budget in (narrow, (narrow + wide) // 2, rng.randint(narrow, wide), wide):
        plan = plan_bits(layers, budget)
        assert (plan.sensitivity, plan.memory_bits, plan.bits) == brute_force(layers, budget)
        assert plan.memory_bits == memory_bits(layers, plan.bits) <= budget


def test_the_sensitive_layer_gets_the_wider_width() -> None:
    """Room to widen one of four equal-sized layers: it goes to the one that suffers most."""
    plain = {1: 0.02, 3: 0.01, 8: 0.0}
    layers = [PlanLayer(1000, plain) for _ in range(4)]
    layers[2] = PlanLayer(1000, {1: 0.30, 3: 0.20, 8: 0.0})
    budget = memory_bits(layers, [3, 3, 8, 3])
    plan = plan_bits(layers, budget)
    assert plan.bits == (3, 3, 8, 3)
    assert plan.sensitivity == pytest.approx(0.03)


def test_a_budget_below_the_narrowest_plan_says_so() -> None:
    layers = [PlanLayer(100, {1: 0.1, 3: 0.0}), PlanLayer(50, {1: 0.2, 3: 0.0})]
    with pytest.raises(ValueError, match="below the narrowest plan's 150 bits"):
        plan_bits(layers, 149)
    assert plan_bits(layers, 150).bits == (1, 1)
    assert plan_bits(layers, 10_000).bits == (3, 3)
