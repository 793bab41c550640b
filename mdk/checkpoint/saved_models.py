"""A stage checkpoint's own model config, for the tools and the quantization report."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from mdk.targets import build
from mdk.errors import ConfigError


def _overrides_key(overrides: Sequence[str], *keys: str) -> bool:
    names = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    return any(n == k or n.startswith(k + ".") for n in names for k in keys)


def with_checkpoint_model(cfg: DictConfig, ck: dict, overrides: Sequence[str]) -> DictConfig:
    """``cfg`` with the checkpoint's own model/chip config unless the user overrode them, and
    its head and loss (they read the model's output) unless the user named a head or loss."""
    saved = ck.get("config")
    if not isinstance(saved, dict) or _overrides_key(overrides, "model", "chip"):
        return cfg
    keys = ["model", "chip"]
    if not _overrides_key(overrides, "head", "loss"):
        keys += ["head", "loss"]
    patch = {k: saved[k] for k in keys if k in saved}
    # nodes replaced whole (another head's schema has other keys), plain values merged
    merged = OmegaConf.merge(cfg, {k: None for k in patch if OmegaConf.is_dict(cfg.get(k))})
    return OmegaConf.merge(merged, patch)


def head_kind(node: Any) -> Optional[str]:
    """The ``kind`` of the head a config node builds (its conf/head/ option name), or None."""
    try:
        return getattr(build(node, "head"), "kind", None)
    except ConfigError:  # a head of a package this machine lacks: keep the command's
        return None
