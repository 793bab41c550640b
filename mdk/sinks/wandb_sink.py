"""Weights & Biases: one wandb run per stage of a job, its id kept in the job's folder.

- Each stage's run id is kept in ``<run_dir>/wandb_ids.json``, so a resumed or requeued job (same
  run dir) continues the same wandb run.
- Without ``WANDB_API_KEY`` (and no ``WANDB_MODE``) it runs offline, never touching the network;
  ``wandb sync <run_dir>/wandb/offline-run-*`` uploads later, all of a job's folders into one run.
- Unlike TensorBoard, wandb cannot forget steps: after a resume, redone steps up to its last
  logged step are dropped by wandb (with its warning) and keep their first values.
"""
from __future__ import annotations

import html
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from mdk.atomic_file import write_json
from mdk.sinks.base import NullSink, check_image

log = logging.getLogger(__name__)

ID_FILE = "wandb_ids.json"


def _stored_ids(run_dir: Path) -> dict[str, str]:
    """The wandb run id of each stage this job dir holds ({} when there is none yet)."""
    p = run_dir / ID_FILE
    if not p.is_file():
        return {}
    try:
        ids = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        log.warning("%s is unreadable (%s): a new wandb run is started", p, e)
        return {}
    return ids if isinstance(ids, dict) else {}


class WandbSink(NullSink):
    def __init__(self, *, run_dir: Path, stage: str, group: Optional[str] = None,
                 resume_step: Optional[int] = None, config: Optional[Mapping[str, Any]] = None,
                 project: str = "mdk", entity: Optional[str] = None,
                 tags: Sequence[str] = (), mode: Optional[str] = None,
                 name: Optional[str] = None) -> None:
        import wandb  # here: an optional heavy package, imported only when this sink is on

        self.wandb = wandb
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        # Never block on the network: without an API key (or with WANDB_MODE set) run offline.
        mode = mode or os.environ.get("WANDB_MODE") or (
            "online" if os.environ.get("WANDB_API_KEY") else "offline")
        ids = _stored_ids(run_dir)
        run_id = ids.get(stage)
        continuing = run_id is not None
        if run_id is None:
            run_id = secrets.token_hex(8)  # wandb ids: [a-z0-9], unique in the project
            write_json(run_dir / ID_FILE, {**ids, stage: run_id}, indent=1, sort_keys=True)
        self.run = wandb.init(project=project, entity=entity, dir=str(run_dir), id=run_id,
                              resume="allow", group=group, job_type=stage,
                              name=name or f"{run_dir.name}-{stage}", tags=list(tags) or None,
                              mode=mode, settings=wandb.Settings(init_timeout=30, silent=True))
        if config:
            # allow_val_change: a resumed job may legitimately carry changed overrides.
            self.run.config.update(dict(config), allow_val_change=True)
        log.info("wandb run %s (%s, %s mode)%s", run_id, stage, mode,
                 f", continued from step {resume_step}" if continuing and resume_step is not None
                 else (", continued" if continuing else ""))

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log({k: float(v) for k, v in scalars.items()}, step=int(step))

    def log_image(self, tag: str, image: torch.Tensor, step: int) -> None:
        hwc = check_image(tag, image).permute(1, 2, 0).numpy()
        self.run.log({tag: self.wandb.Image(hwc)}, step=int(step))

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.run.log({tag: self.wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step=int(step))

    def close(self) -> None:
        self.run.finish()
