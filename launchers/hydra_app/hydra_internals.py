"""The one place mdk reads Hydra's private modules (``hydra._internal``), read-only: nothing here
or anywhere else in mdk assigns to, wraps or patches them (tests/test_layout.py keeps it so).

- ``BasicSweeper``: the sweeper a plain ``-m`` runs. Its ``split_arguments`` turns the command's
  overrides into the jobs it will launch; the sweep check (sweep_check.py) checks exactly those
  jobs before any starts, so it asks the sweeper itself rather than expanding them another way.
- ``BasicLauncher``: the launcher of a plain ``-m``, which runs one job at a time in this process;
  the search sweeper runs one trial at a time with it (optuna_sweeper.py).

Hydra does not promise these names across releases: ``CHECKED_ON`` lists the versions they were
checked against, and tests/test_hydra_internals.py fails on any other, naming what to check.
"""
from __future__ import annotations

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

__all__ = ["BASIC_SWEEPER", "BasicLauncher", "BasicSweeper", "CHECKED_ON"]

CHECKED_ON = ("1.3.8",)  # hydra-core versions whose internals above were read
BASIC_SWEEPER = f"{BasicSweeper.__module__}.{BasicSweeper.__qualname__}"  # hydra.sweeper._target_
