"""Metric sinks, built from ``conf/logger/*.yaml``. Off (or not rank 0) means a null object, so
the engine never asks "is logging on?".

A logger config holds ``log_every`` and a map ``sinks: {name: {_target_: class, options...}}``;
``logger=none`` has an empty map, ``logger=[tensorboard,wandb]`` merges both maps (Hydra's
multiple choice from one group), and ``logger.sinks.<name>=null`` turns one off. A new sink is a
YAML file in ``conf/logger/`` plus a class whose constructor takes the keyword arguments
``run_dir, stage, group, resume_step, config`` (see :func:`build_sinks`) and its YAML options,
with the methods of :class:`NullSink`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Optional

from mdk.errors import import_target
from mdk.sinks.base import MultiSink, NullSink
from mdk.sinks.tensorboard_sink import TensorBoardSink
from mdk.sinks.wandb_sink import WandbSink

log = logging.getLogger(__name__)


def build_sinks(logger_cfg: Any, run_dir: str | Path, config: Mapping[str, Any], is_main: bool,
                *, stage: Optional[str] = None, group: Optional[str] = None,
                resume_step: Optional[int] = None) -> NullSink:
    """The sinks of ``logger_cfg.sinks`` for one stage, or a :class:`NullSink`.

    - ``run_dir``: the job's output folder (Hydra's run/job dir); sinks write under it.
    - ``config``: the resolved run config as a plain dict (recorded by wandb).
    - ``is_main``: False on ranks other than 0, which then get a NullSink (no files, no runs).
    - ``stage``: the stage logging (``step1`` ... ``step4``, ``cal``); TensorBoard writes
      ``<run_dir>/tensorboard/<stage>``, wandb makes one run per stage (``job_type``). Default:
      ``config["step"]["name"]``.
    - ``group``: the sweep this job belongs to (e.g. the sweep dir name), None for a single run.
    - ``resume_step``: the global step of the checkpoint this stage resumes from, None when it
      starts fresh. TensorBoard discards this stage's events after it (they are redone).

    Each sink is constructed as ``cls(run_dir=, stage=, group=, resume_step=, config=,
    **options)`` with the options of its YAML node. Errors in a node raise ``ConfigError``
    naming ``logger.sinks.<name>``.
    """
    from mdk.config import ConfigError

    if not is_main:
        return NullSink()
    if stage is None:
        stage = str((config.get("step") or {}).get("name") or "train")
    nodes = logger_cfg.get("sinks") if hasattr(logger_cfg, "get") else None
    if nodes is None:
        nodes = {}
    if not hasattr(nodes, "items"):
        raise ConfigError(f"logger.sinks={nodes!r} must be a map of sink nodes (each with a "
                          "_target_), e.g. logger=tensorboard; {} for none")
    sinks: list[NullSink] = []
    try:
        for name, node in nodes.items():
            where = f"logger.sinks.{name}"
            if node is None:  # logger.sinks.<name>=null turns one sink off
                continue
            if not hasattr(node, "items") or "_target_" not in node:
                raise ConfigError(f"{where}={node!r} needs a _target_ (the sink class), e.g. "
                                  f"{where}._target_=mdk.sinks.TensorBoardSink")
            options = {str(k): v for k, v in node.items() if k != "_target_"}
            if hasattr(node, "_get_node"):  # an OmegaConf node: plain containers for the class
                from omegaconf import OmegaConf

                options = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items()
                           if k != "_target_"}
            cls = import_target(node["_target_"], f"{where}._target_",
                                "give a class path such as mdk.sinks.TensorBoardSink")
            try:
                sinks.append(cls(run_dir=Path(run_dir), stage=stage, group=group,
                                 resume_step=resume_step, config=config, **options))
            except TypeError as e:
                raise ConfigError(f"{where}: {e}; check the options of this sink in "
                                  "conf/logger/") from None
    except BaseException:
        for s in sinks:  # release the sinks already made (wandb runs, open event files)
            try:
                s.close()
            except Exception as e:
                log.warning("closing %s failed: %s", type(s).__name__, e)
        raise
    if not sinks:
        return NullSink()
    return sinks[0] if len(sinks) == 1 else MultiSink(sinks)


__all__ = ["MultiSink", "NullSink", "TensorBoardSink", "WandbSink", "build_sinks"]
