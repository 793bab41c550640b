"""launchers/hydra_app/hydra_internals.py: the one module that reads Hydra's private modules. On a
Hydra version it was not checked against, this fails, naming what to check; on the checked one,
what mdk uses of them behaves as mdk expects."""
from __future__ import annotations

import importlib.metadata
import inspect

from hydra.core.override_parser.overrides_parser import OverridesParser

from launchers.hydra_app import hydra_internals
from launchers.hydra_app.hydra_internals import BASIC_SWEEPER, CHECKED_ON, BasicLauncher, BasicSweeper
from mdk.compose import compose


def test_the_installed_hydra_is_one_the_private_reads_were_checked_on():
    installed = importlib.metadata.version("hydra-core")
    assert installed in CHECKED_ON, (
        f"hydra-core {installed} is installed, but launchers/hydra_app/hydra_internals.py reads "
        f"hydra._internal as checked on {CHECKED_ON}: check BasicSweeper.split_arguments, "
        "BasicLauncher and the basic sweeper's _target_ on this version, then add it to CHECKED_ON")


def test_the_basic_sweeper_splits_a_sweep_into_its_jobs_as_mdk_reads_them():
    assert BASIC_SWEEPER == "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    assert list(inspect.signature(BasicSweeper.split_arguments).parameters) == [
        "overrides", "max_batch_size"]
    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x", "c=range(2)"])
    assert BasicSweeper.split_arguments(parsed, None) == [[
        ["a=1", "b=x", "c=0"], ["a=1", "b=x", "c=1"], ["a=2", "b=x", "c=0"], ["a=2", "b=x", "c=1"]]]


def test_the_basic_classes_are_those_a_plain_sweep_runs():
    """What ``python run.py -m ...`` composes as its sweeper and launcher are these classes."""
    hydra = compose(["debug=tiny"], hydra_config=True).hydra
    assert hydra.sweeper._target_ == BASIC_SWEEPER
    assert hydra.launcher._target_ == f"{BasicLauncher.__module__}.{BasicLauncher.__name__}"
    # The module gathers every private name mdk uses; nothing else is exported from it.
    assert sorted(hydra_internals.__all__) == ["BASIC_SWEEPER", "BasicLauncher", "BasicSweeper",
                                               "CHECKED_ON"]
