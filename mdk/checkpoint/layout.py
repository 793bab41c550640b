"""The one owner of stage checkpoints: the layout ``<paths.checkpoints>/<stage>/{best,last}.pth``,
what a checkpoint holds, and where a stage starts (docs/pipeline.md, "Where a stage's weights come
from"; reading and loading them: mdk/checkpoint/weights_file.py). A finished checkpoint of a stage
that does not train means "done": a rerun reports it and does not redo the work.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from mdk import dist
from mdk.checkpoint.files import (CheckpointError, atomic_save, load_checkpoint,
                                  remove_stale_temps, save_checkpoint)
from mdk.checkpoint.meaning import check_resume, hparams_of, log_changes, meaning_of, plain
from mdk.checkpoint.weights_file import OWN, input_advice, load_start, of_checkpoint, read_weights
from mdk.errors import MissingStageInput
from mdk.paths import resolve_path
from mdk.stage import chain
from mdk.stage_config import StageConf
from mdk.world import World

log = logging.getLogger(__name__)

BEST, LAST = "best.pth", "last.pth"
RESUME_NAMES = (LAST, BEST)
FORMAT = 2  # 1: training state in flat keys (iter, epoch, best_metric, ...), read through _upgrade


def _upgrade(ck: dict[str, Any]) -> dict[str, Any]:
    """A format-1 checkpoint in today's layout, so its run resumes."""
    if ck.get("format", 1) >= FORMAT or "iter" not in ck:
        return ck
    out = {k: v for k, v in ck.items() if k not in ("iter", "epoch", "best_metric", "best_epoch",
                                                    "best_metrics")}
    out["trainer"] = {"epoch": ck.get("epoch", 0), "iter": ck["iter"]}
    out["hooks"] = {"CheckpointHook": {"best_metric": ck.get("best_metric", float("-inf")),
                                       "best_epoch": ck.get("best_epoch", -1),
                                       "best_metrics": ck.get("best_metrics") or {}}}
    return out


def iteration(ck: dict[str, Any]) -> int:
    """The optimizer steps a checkpoint's stage had made (0 for one that does not train)."""
    return int((ck.get("trainer") or {}).get("iter", 0))


def find_resume(stage_dir: Path) -> tuple[Optional[dict[str, Any]], Optional[Path]]:
    """The newest readable full-state checkpoint of a stage, or (None, None). An unreadable file
    is renamed to ``<name>.corrupt`` (kept, and out of the next save's way) and skipped."""
    stage_dir = Path(stage_dir)
    remove_stale_temps(stage_dir)
    found: list[tuple[int, Path, dict]] = []
    for name in (LAST, BEST):
        p = stage_dir / name
        if not p.is_file():
            continue
        try:
            ck = _upgrade(load_checkpoint(p))
        except CheckpointError as e:
            aside = p.with_name(p.name + ".corrupt")
            os.replace(p, aside)
            log.warning("%s. Moved it to %s; resuming from the previous good checkpoint instead", e,
                        aside)
            continue
        if ("optimizer" not in ck or "trainer" not in ck) and not ck.get("finished"):
            log.warning("%s has no training state (optimizer/iter); not resuming from it", p)
            continue
        found.append((iteration(ck), p, ck))
    if not found:
        return None, None
    it, p, ck = max(found, key=lambda t: (t[0], t[1].name == LAST))
    if p.name != LAST:
        # Normal after a kill between writing best.pth and last.pth at an epoch end.
        why = ("it is newer than last.pth" if any(q.name == LAST for _, q, _ in found)
               else "last.pth is missing or unusable")
        log.warning("resuming from %s (iteration %d): %s", p, it, why)
    return ck, p


def checkpoint_root(cfg: DictConfig) -> Path:
    return resolve_path(cfg.paths.checkpoints, os.getcwd())


@dataclass
class Start:
    """Where a stage's weights came from: its own state, an input checkpoint, or nothing."""
    resume: Optional[dict[str, Any]] = None
    path: Optional[Path] = None

    @property
    def finished(self) -> bool:
        return bool(self.resume and self.resume.get("finished"))


class StageCheckpointer:
    def __init__(self, cfg: DictConfig, spec: StageConf, world: Optional[World] = None) -> None:
        self.cfg, self.spec = cfg, spec
        self.world = world or World()
        self.root = checkpoint_root(cfg)
        self.dir = self.root / spec.name

    @property
    def best(self) -> Path:
        return self.dir / BEST

    @property
    def last(self) -> Path:
        return self.dir / LAST

    # --- where the stage starts -----------------------------------------------------------
    def input_path(self) -> Optional[Path]:
        """The file this stage starts from: ``step.init_weights``, else its input stage's
        best.pth, else the record's ``pretrained`` folder's best.pth or newest *.pth; None: random
        init, where allowed."""
        if self.spec.init_weights:
            path = resolve_path(self.spec.init_weights, os.getcwd())
            if not path.is_file():
                raise MissingStageInput(f"step.init_weights={self.spec.init_weights}: {path} does "
                                        "not exist; name an existing .pth (an mdk or GTI MDK "
                                        "checkpoint, a torchvision VGG file)")
            return path
        src = self.spec.init_from
        if src is not None:
            path = self.root / src / BEST
            if not path.is_file() and self.spec.init_required:
                raise MissingStageInput(
                    f"{self.spec.name} starts from {src}'s result but {path} does not exist. Run "
                    f"`python run.py step={src}` first (with the same model/dataset/paths), or the "
                    f"whole chain with `python run.py pipeline=[{','.join(chain(self.spec.name))}]`")
            return path if path.is_file() else None
        if self.spec.pretrained is None:
            return None
        d = self.root / self.spec.pretrained
        cands = [d / BEST] if (d / BEST).is_file() else sorted(
            d.glob("*.pth"), key=lambda p: p.stat().st_mtime, reverse=True)
        if cands:
            return cands[0]
        log.info("no pretrained weights in %s: %s starts from random weights", d, self.spec.name)
        return None

    def resumable(self) -> tuple[Optional[dict[str, Any]], Optional[Path]]:
        """This stage's own newest readable state; rank 0 looks first (it may move a file)."""
        if self.world.is_main:
            found = find_resume(self.dir)
        dist.barrier()
        if not self.world.is_main:
            found = find_resume(self.dir)
        return found

    def start(self, model: torch.nn.Module) -> Start:
        """Load this stage's starting weights into ``model`` (not yet in the stage's mode)."""
        if self.cfg.trainer.resume:
            ck, path = self.resumable()
            if ck is not None:
                changes = check_resume(ck, path, self.cfg, self.spec)  # refuses another meaning
                of_checkpoint(path, ck).load(model, OWN, prefer_ema=False)
                if ck.get("finished"):
                    log.info("%s already done (%s); delete it to run it again", self.spec.name, path)
                else:
                    log.info("resuming %s from %s (iteration %d)", self.spec.name, path,
                             iteration(ck))
                if self.world.is_main:
                    log_changes(self.spec.name, path, iteration(ck), changes)
                return Start(ck, path)
        init = self.input_path()
        if init is None:
            return Start()
        start = read_weights(init, input_advice(self.spec))
        said = load_start(model, start, self.cfg, self.spec)
        if self.world.is_main:
            log.info("%s starts from %s (%s)%s", self.spec.name, init, start.what,
                     f": {said}" if said else "")
        return Start(None, init)

    # --- what a checkpoint holds ----------------------------------------------------------
    def contents(self, model: torch.nn.Module, **extra: Any) -> dict[str, Any]:
        """A checkpoint of this stage: its record (so a loader needs no lookup), ``meaning`` and
        ``hparams`` (mdk/checkpoint/meaning.py), and ``extra`` (the parts of
        mdk/engine/run_state.py, metrics...)."""
        return {"format": FORMAT, "model": model.state_dict(), "stage": self.spec.name,
                # the record is what loaders need, not the work's parameters (calibration)
                "stage_spec": {k: v for k, v in plain(self.cfg.step).items()
                               if k != "calibration"}, "config": plain(self.cfg),
                "meaning": meaning_of(self.cfg, self.spec), "hparams": hparams_of(self.cfg),
                "world_size": self.world.size, **extra}

    def save(self, state: dict[str, Any], *names: str) -> None:
        """Write ``state`` under each of ``names``; NaN/Inf weights are refused."""
        for n in names:
            save_checkpoint(state, self.dir / n)

    def save_done(self, state: dict[str, Any]) -> None:
        """A stage without training: its one result is both best and last, marked finished."""
        state = {**state, "finished": True}
        for n in (BEST, LAST):
            atomic_save(state, self.dir / n)
