"""Hydra takes sweeper classes only from the ``hydra_plugins`` namespace package, so mdk's Optuna
sweeper is declared here; its code is launchers/hydra_app/optuna_sweeper.py. Hydra imports this
file at every start: Optuna itself loads only when a search runs.
"""
from launchers.hydra_app.optuna_sweeper import SearchSweeper


class OptunaSweeper(SearchSweeper):
    """``hydra/sweeper=mdk_optuna``: an Optuna study, trials asked and told as jobs end, pruning,
    a study that survives its sweeping process."""
