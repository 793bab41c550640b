"""A trial's side of a search: its run reports the objective per epoch to the study and stops
when the study's pruner says so (docs/cluster.md, "Searches", Pruning). Job N of an mdk_optuna
study is trial N; its ``TrialReporter`` joins the objective stage's ``trainer.hooks``. Never pruned
at the last epoch; a study it cannot reach is only a warning. A study of several objectives gets
no reporter: Optuna cannot prune those.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from launchers.hydra_app.job import is_multirun
from launchers.hydra_app.objective import PRUNED
from launchers.hydra_app.optuna_study import SWEEPER, make_pruner, open_trial
from mdk import dist
from mdk.engine.loop import HookBase

log = logging.getLogger(__name__)

HOOK = "optuna_trial"  # its name in trainer.hooks


def is_trial() -> bool:
    """This job is a trial of an mdk_optuna study (call it in a multirun job)."""
    return HydraConfig.get().sweeper.get("_target_") == SWEEPER


def trial_hook(cfg: DictConfig, stages: Sequence[str]) -> Optional[tuple[str, dict[str, Any]]]:
    """(stage, ``trainer.hooks`` node) for a trial of a one-objective study; None otherwise."""
    if not (is_multirun() and cfg.get("objective") is not None and is_trial()
            and isinstance(cfg.objective.metric, str)):
        return None
    hc = HydraConfig.get()
    pruner = hc.sweeper.get("pruner")
    node = {"_target_": f"{__name__}.TrialReporter", "study": str(hc.sweeper.study_name),
            "storage": str(hc.sweeper.storage), "trial": int(hc.job.num),
            "metric": str(cfg.objective.metric),
            "pruner": OmegaConf.to_container(pruner, resolve=True) if pruner else None}
    return str(cfg.objective.get("stage") or stages[-1]), node


class TrialReporter(HookBase):
    """``trainer.hooks.optuna_trial``, on every rank of the objective stage."""

    def __init__(self, *, stage: str, run_dir: Path, is_main: bool,
                 so_far: Callable[[], Mapping[str, Any]], study: str, storage: str, trial: int,
                 metric: str, pruner: Optional[dict] = None) -> None:
        self.stage, self.is_main, self.so_far = stage, is_main, so_far
        self.study, self.storage, self.number, self.metric = study, storage, trial, metric
        self.pruner = pruner
        self.trial: Any = None

    def before_train(self) -> None:
        if not self.is_main:
            return
        try:
            self.trial = open_trial(self.study, self.storage, self.number,
                                    make_pruner(OmegaConf.create(self.pruner) if self.pruner else None))
        except Exception as e:  # reporting is a service to the search, never a reason to fail
            log.warning("trial %d of study %s: cannot open it in %s (%s); this run reports "
                        "nothing and is not pruned", self.number, self.study, self.storage, e)

    def _report(self, epoch: int, last: bool) -> Optional[str]:
        """Rank 0: report this epoch; the reason to stop, or None."""
        value = self.so_far().get(self.metric)
        if self.trial is None or value is None or not math.isfinite(float(value)):
            return None
        from optuna.exceptions import UpdateFinishedTrialError  # optuna: trial runs only

        try:
            self.trial.report(float(value), step=epoch)
            if last or not self.trial.should_prune():
                return None
        except UpdateFinishedTrialError as e:  # a new sweep marked it FAIL: nobody waits for it
            return f"trial {self.number} is no longer running in study {self.study} ({e})"
        except Exception as e:
            log.warning("trial %d: reporting to study %s failed (%s); this run reports nothing "
                        "more", self.number, self.study, e)
            self.trial = None
            return None
        return (f"{PRUNED} by study {self.study} (trial {self.number}) at epoch {epoch}: "
                f"{self.metric} {float(value):.6g}")

    def after_epoch(self) -> None:
        t = self.trainer
        epoch = t.epoch + 1
        reason = self._report(epoch, epoch >= t.epochs) if self.is_main else None
        reason = dist.broadcast_object(reason)  # every rank stops after the same epoch
        if reason:
            t.stop, t.stop_reason = True, str(reason)
            log.warning("%s: %s stops after epoch %d/%d (its last.pth holds that epoch)",
                        reason, self.stage, epoch, t.epochs)
