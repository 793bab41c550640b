"""What a stage checkpoint means and what it was trained with, compared with a later run's config.

Every stage checkpoint stores two flat ``{config key: value}`` records: ``meaning``, the facts
its weights are only valid under (``MEANING_KEYS``, and the chip once quantized), and
``hparams``, what it was trained with (``HPARAM_KEYS``). The rules of the comparison:
docs/pipeline.md, "What a checkpoint knows, and what a resume compares".
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from mdk.errors import CheckpointError, ConfigError
from mdk.calibration_config import calibration_node
from mdk.stage_config import StageConf

log = logging.getLogger(__name__)

_ABSENT = object()
MEANING_KEYS = ("dataset.class_names", "model.image_size", "model.net", "step.name", "step.quant")
HPARAM_KEYS = ("optim", "scheduler", "loss", "seed", "trainer.epochs", "trainer.batch_size",
               "trainer.limit_train_batches", "trainer.grad_clip", "trainer.ema", "dataset.augment",
               "model.freeze", "model.freeze_epochs", "step.calibration", "trainer.time",
               "trainer.image_sizes")
MASK_BITS = "model.net.mask_bits"  # not a meaning of float weights
_OWN_STAGE = ("step.",)  # meaning keys that describe the stage itself, not its input's
_SKIP = ("_partial_",)   # how a node is instantiated, not what it is
_WHY = {"dataset.class_names": "its class channels would mean other classes",
        "model.image_size": "its weights were trained at the other input size",
        "chip": "its weights are quantized for the other chip",
        "step.quant": "it was trained with its chip layers in the other mode",
        "step.name": "it was written by another stage"}

# A run-state part and the key naming its class: another class cannot take its saved state.
_PART_CLASS = {"optimizer": "optim._target_", "loss": "loss._target_"}

Change = tuple[str, Any, Any]  # (key, the checkpoint's value, this run's value)


def plain(v: Any) -> Any:
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v


def _flat(cfg: DictConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    """``{dotted key: plain value}`` of ``keys``' leaves."""
    out: dict[str, Any] = {}

    def put(key: str, v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if k not in _SKIP:
                    put(f"{key}.{k}", x)
        else:
            out[key] = v

    for key in keys:
        v = OmegaConf.select(cfg, key, default=_ABSENT)
        if v is not _ABSENT:
            put(key, plain(v))
    return out


def meaning_of(cfg: DictConfig, spec: StageConf) -> dict[str, Any]:
    out = _flat(cfg, MEANING_KEYS)
    if spec.quant.weights or spec.quant.activations:
        out["chip"] = str(cfg.chip)  # the chip's bit widths are in the weights
    else:
        out.pop(MASK_BITS, None)  # float weights fit any widths (a bit plan comes after step1)
    return out


def _float_weights(meaning: Mapping[str, Any]) -> bool:
    return meaning.get("step.quant.weights") is False and meaning.get("step.quant.activations") is False


def hparams_of(cfg: DictConfig) -> dict[str, Any]:
    flat = _flat(cfg, HPARAM_KEYS)
    # a cosine over the whole stage (T_max: null) is recorded as the length it runs, as the
    # checkpoints written when T_max was ${trainer.epochs} hold it
    if "scheduler.T_max" in flat and flat["scheduler.T_max"] is None:
        flat["scheduler.T_max"] = flat.get("trainer.epochs")
    return flat


def _read_hparams(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``hparams`` as written today: a record from before calibration methods were nodes holds
    ``step.calibration.method`` and the old fixed keys; they read as the method's node."""
    out = dict(flat)
    prefix = "step.calibration."
    if prefix + "method" not in out:
        return out
    old = {k[len(prefix):]: out.pop(k) for k in list(out) if k.startswith(prefix)}
    try:
        node = calibration_node(old)
    except ConfigError:  # a class this machine lacks: compared as written
        return dict(flat)
    out.update({prefix + k: v for k, v in node.items()})  # the old keys were all plain values
    return out


def _now(cfg: DictConfig, key: str) -> Any:
    v = plain(OmegaConf.select(cfg, key, default=_ABSENT))
    return str(v) if key == "chip" and v is not _ABSENT else v


def _show(v: Any) -> str:
    return "(not set)" if v is _ABSENT else repr(v) if isinstance(v, str) else str(v)


def meaning_difference(ck: Mapping[str, Any], cfg: DictConfig, own: bool) -> Optional[Change]:
    """The first meaning key whose value in ``cfg`` differs from the checkpoint's, or None.
    ``own``: the stage's own checkpoint (its ``step.*`` keys count too), else an input stage's."""
    meaning = ck.get("meaning") or {}
    for key, then in meaning.items():
        if not own and key.startswith(_OWN_STAGE) or key == MASK_BITS and _float_weights(meaning):
            continue
        now = _now(cfg, key)
        if now != then:
            return key, then, now
    return None


def resume_changes(ck: Mapping[str, Any], cfg: DictConfig) -> Optional[list[Change]]:
    """The hyper-parameters ``cfg`` changes against the checkpoint's; None when it records none."""
    saved = ck.get("hparams")
    if saved is None:
        return None
    saved, now = _read_hparams(saved), _read_hparams(hparams_of(cfg))
    # a key the checkpoint predates, left at null here, changes nothing (keys come with null)
    return [(k, saved.get(k, _ABSENT), now.get(k, _ABSENT)) for k in dict.fromkeys([*saved, *now])
            if saved.get(k, _ABSENT) != now.get(k, _ABSENT)
            and not (k not in saved and now.get(k) is None)]


def nothing_left(ck: Mapping[str, Any], cfg: DictConfig, spec: StageConf) -> bool:
    """The checkpoint has done all this run would do (one-pass work finished, or training at the
    end of ``trainer.epochs``)."""
    if not spec.trains:
        return bool(ck.get("finished"))
    t = ck.get("trainer") or {}
    budget = (ck.get("hooks") or {}).get("TimeBudgetHook")  # trainer.time: the epochs it chose
    if budget and budget.get("done"):
        return True
    epoch = int(t.get("epoch", 0))
    epochs = int(budget["epochs"]) if budget else int(cfg.trainer.epochs)
    return epoch >= epochs or (bool(ck.get("epoch_done")) and epoch + 1 >= epochs)


def _why(key: str) -> str:
    return next((w for k, w in _WHY.items() if key.startswith(k)),
                "its weights belong to the other model")


def _differs(key: str, then: Any, now: Any) -> str:
    return f"{key}={_show(now)} differs from the checkpoint's {_show(then)}"


def check_resume(ck: Mapping[str, Any], path: Path, cfg: DictConfig,
                 spec: StageConf) -> Optional[list[Change]]:
    """Refuse to resume ``spec`` from its own checkpoint under another meaning, or when nothing is
    left to do and a hyper-parameter changed; else ``resume_changes``."""
    where = (f"use the checkpoint's value, give this run another paths.checkpoints, or "
             f"trainer.resume=false to start {spec.name} over (its checkpoints are then replaced)")
    diff = meaning_difference(ck, cfg, own=True)
    if diff is not None:
        raise CheckpointError(f"{_differs(*diff)} ({path}): {_why(diff[0])}; {where}")
    changes = resume_changes(ck, cfg)
    if changes and nothing_left(ck, cfg, spec):
        more = (f" (and {len(changes) - 1} more: {', '.join(k for k, _, _ in changes[1:])})"
                if len(changes) > 1 else "")
        raise CheckpointError(
            f"{spec.name} is already done in {path.parent} and this run changes what it was made "
            f"with: {_differs(*changes[0])}{more}; nothing is left to do, so the new value would "
            f"not be used. Run it again with trainer.resume=false (its checkpoints are replaced), "
            "put the value back to see the old result, or give this run another "
            "paths.checkpoints")
    return changes


def check_input(ck: Mapping[str, Any], path: Path, cfg: DictConfig, spec: StageConf) -> None:
    """Refuse to start ``spec`` from its input stage's checkpoint ``ck`` of another meaning."""
    diff = meaning_difference(ck, cfg, own=False)
    if diff is not None:
        raise CheckpointError(
            f"{_differs(*diff)} ({path}, the input of {spec.name}): {_why(diff[0])}; run "
            f"step={spec.init_from} again with this value, use the checkpoint's value, or point "
            "paths.checkpoints at a matching run")


def unfit_parts(ck: Mapping[str, Any], cfg: DictConfig) -> list[str]:
    """The run-state parts whose class this run changes (``optim=sgd`` on an AdamW checkpoint):
    their saved state does not fit, so they start fresh."""
    saved = ck.get("hparams") or {}
    return [part for part, key in _PART_CLASS.items()
            if key in saved and saved[key] != _now(cfg, key)]


def log_changes(stage: str, path: Path, iteration: int, changes: Optional[list[Change]]) -> None:
    if changes is None:
        log.info("%s was written before checkpoints recorded what they mean and were trained "
                 "with: this run's config is not compared with it", path)
    elif changes:
        fresh = [p for p, key in _PART_CLASS.items() if any(k == key for k, _, _ in changes)]
        log.warning("%s resumes at iteration %d with changed hyper-parameters; the new values "
                    "apply from there on (the iterations before keep the old ones): %s%s", stage,
                    iteration, ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, a, b in changes),
                    f"; another class: the {' and '.join(fresh)} state starts fresh" if fresh
                    else "")


def _overrides_key(overrides: Sequence[str], *keys: str) -> bool:
    names = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    return any(n == k or n.startswith(k + ".") for n in names for k in keys)


def with_checkpoint_model(cfg: DictConfig, ck: Mapping[str, Any],
                          overrides: Sequence[str]) -> DictConfig:
    """``cfg`` with the checkpoint's own model/chip config unless the user overrode them, and
    its head and loss (they read the model's output) unless the user named a head or loss: the
    model a tool or the report rebuilds for a stage checkpoint."""
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
