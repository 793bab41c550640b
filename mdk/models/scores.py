"""How a head's confidence and class channels become scores in [0, 1], and the loss that trains
each reading (docs/pipeline.md, Heads): ``linear`` (the GTI MDK's: the raw value clamped,
regressed to 0/1 with smooth-L1) or ``logistic`` (``sigmoid(gain * (x - 0.5))``, trained by
binary cross-entropy). 0..1 on the channel spans p 0.007..0.993 at gain 10, so the chip's 5-bit
last layer (one cap for every channel, clipped at 0) keeps the range the boxes need.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from mdk.checks import BadValue, number

READINGS = ("linear", "logistic")


def check_reading(key: str, value: str) -> str:
    """``linear`` or ``logistic``, or one line naming ``key``."""
    if value not in READINGS:
        raise BadValue.of(key, value, f"must be one of {', '.join(READINGS)}")
    return value


def readings(where: str, conf_scores: str, class_scores: str, score_gain: float) -> dict[str, Any]:
    """The three settings, checked, as ``where.<key>`` in any error."""
    return {"conf_scores": check_reading(f"{where}.conf_scores", conf_scores),
            "class_scores": check_reading(f"{where}.class_scores", class_scores),
            "score_gain": number(f"{where}.score_gain", score_gain, 0.0, low_open=True)}


def read_scores(x: torch.Tensor, reading: str, gain: float) -> torch.Tensor:
    """Confidence or class channels -> scores in [0, 1]."""
    if reading == "logistic":
        return torch.sigmoid(gain * (x - 0.5))
    return x.clamp(0, 1)


def score_loss(x: torch.Tensor, target: torch.Tensor, reading: str, gain: float,
               beta: float) -> torch.Tensor:
    """Per-element loss of channels ``x`` against 0/1 targets: smooth-L1 for a linear reading,
    binary cross-entropy on ``gain * (x - 0.5)`` for a logistic one (its gradient does not fade
    while a class is still a guess)."""
    if reading == "logistic":
        return F.binary_cross_entropy_with_logits(gain * (x - 0.5), target, reduction="none")
    return F.smooth_l1_loss(x, target, reduction="none", beta=beta)


def prior_channel(p: float, gain: float) -> float:
    """The channel value a logistic score reads as probability ``p``."""
    return 0.5 + math.log(p / (1 - p)) / gain
