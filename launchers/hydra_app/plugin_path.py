"""Puts ``launchers/plugins`` (the project's ``hydra_plugins`` portion) and the repository root
on ``sys.path`` and on ``PYTHONPATH`` (submitit jobs unpickle the launcher). Standard library
only: run.py calls it before importing Hydra.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "launchers" / "plugins"


def add_plugin_path() -> None:
    # Our conf/hydra/launcher presets share the submitit plugin's names on purpose (so
    # `hydra/launcher=submitit_slurm` picks them); Hydra 1.3 warns about that on every run.
    warnings.filterwarnings("ignore", category=UserWarning,
                            message=r"(?s).*validated against ConfigStore schema with the same name")
    for p in (str(REPO), str(PLUGINS)):
        if p not in sys.path:
            sys.path.insert(0, p)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    new = [p for p in (str(REPO), str(PLUGINS)) if p not in parts]
    if new:
        os.environ["PYTHONPATH"] = os.pathsep.join([*new, *parts])
