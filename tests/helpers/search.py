"""Runs of the Optuna search through python run.py -m."""
from __future__ import annotations

import sys

from conftest import REPO, TINY


def _search(sweep, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "run.py"), "-m", "hparams_search=lr_warmup", "hydra.sweeper.params=null",
            "objective.metric=final_loss", "hydra.sweeper.direction=minimize", "hydra.sweeper.study_name=t",
            *TINY, "trainer.limit_train_batches=2", f"hydra.sweep.dir={sweep}", *extra]
