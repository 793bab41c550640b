"""The chip table (the top-level ``chip`` key) and the checks of ``chip`` and ``export``.

(weight bits, bias bits) per mask width and the square input sizes come from the GTI MDKs. No
torch here: the config checks import it before anything else.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from mdk.checks import one_of
from mdk.errors import ConfigError

CHIP_BITS: dict[str, dict[int, tuple[int, int]]] = {
    "5801": {1: (8, 20), 3: (8, 20), 8: (8, 20)},
    "2801": {1: (12, 12), 3: (12, 18)},
    "2803": {2: (12, 12), 5: (12, 16), 12: (12, 20)},
}
CHIPS = tuple(CHIP_BITS)  # the top-level ``chip`` key's words
CHIP_INPUT_SIZES: dict[str, tuple[int, ...]] = {chip: (224, 320, 448, 640) for chip in CHIP_BITS}
SUPPORTED_MASKS = (1, 2, 3, 5, 8, 12)


def chip_bits(chip: str, mask_bits: int) -> tuple[int, int]:
    """(weight bits, bias bits) of ``mask_bits`` on ``chip``; a clear error if the chip lacks it."""
    table = CHIP_BITS[one_of("chip", str(chip), CHIPS)]
    if int(mask_bits) not in table:
        raise ValueError(f"chip {chip} does not support {mask_bits}-bit conv masks (it supports "
                         f"{sorted(table)}); change model mask_bits or pick another chip")
    return table[int(mask_bits)]


def chip_takes(chip: str, image_size: Any) -> bool:
    """Whether ``chip`` runs a model whose input is ``image_size`` x ``image_size`` pixels."""
    return str(chip) in CHIP_INPUT_SIZES and image_size in CHIP_INPUT_SIZES[str(chip)]


def size_refusal(chip: str, image_size: Any) -> str:
    """What to tell a user who exports a chip model at an input size ``chip`` does not take."""
    sizes = ", ".join(map(str, CHIP_INPUT_SIZES[str(chip)]))
    return (f"model.image_size={image_size} is no input size of chip {chip} (it takes {sizes} px), "
            "so the chip could not run the exported model; set model.image_size to one of them, or "
            "export.allow_any_size=true for a simulation-only chip model (no GTI hand-off)")


def check_export_size(cfg: DictConfig) -> None:
    """Refuse, before any stage trains, an export the chip could not run (unless allowed)."""
    if not allow_any_size(cfg) and not chip_takes(cfg.chip, cfg.model.image_size):
        raise ConfigError(size_refusal(cfg.chip, cfg.model.image_size))


def allow_any_size(cfg: DictConfig) -> bool:
    """``export.allow_any_size`` (false where a config has no ``export`` node)."""
    return bool(OmegaConf.select(cfg, "export.allow_any_size", default=False))


def check_chip(cfg: DictConfig) -> None:
    one_of("chip", str(cfg.chip), CHIPS)
    flag = OmegaConf.select(cfg, "export.allow_any_size", default=False)
    if not isinstance(flag, bool):
        raise ConfigError(f"export.allow_any_size={flag!r} must be true or false")
