"""The chip table: what each GTI chip accepts (the top-level ``chip`` key), and its check. A leaf
(no torch): the config checks read it before anything else is imported.

(weight bits, bias bits) per chip and mask bit width, from the GTI MDKs.
"""
from __future__ import annotations

from omegaconf import DictConfig

from mdk.errors import ConfigError

CHIP_BITS: dict[str, dict[int, tuple[int, int]]] = {
    "5801": {1: (8, 20), 3: (8, 20), 8: (8, 20)},
    "2801": {1: (12, 12), 3: (12, 18)},
    "2803": {2: (12, 12), 5: (12, 16), 12: (12, 20)},
}
CHIPS = tuple(CHIP_BITS)
SUPPORTED_MASKS = (1, 2, 3, 5, 8, 12)


def chip_bits(chip: str, mask_bits: int) -> tuple[int, int]:
    """(weight bits, bias bits) of ``mask_bits`` on ``chip``; a clear error if the chip lacks it."""
    chip = str(chip)
    if chip not in CHIP_BITS:
        raise ValueError(f"chip={chip!r} is unknown; choose one of {sorted(CHIP_BITS)}")
    table = CHIP_BITS[chip]
    if int(mask_bits) not in table:
        raise ValueError(f"chip {chip} does not support {mask_bits}-bit conv masks (it supports "
                         f"{sorted(table)}); change model mask_bits or pick another chip")
    return table[int(mask_bits)]


def check_chip(cfg: DictConfig) -> None:
    if str(cfg.chip) not in CHIPS:
        raise ConfigError(f"chip={cfg.chip} is not a supported chip; use one of {', '.join(CHIPS)}")
