"""mdk's Optuna sweeper, declared in the ``hydra_plugins`` namespace where Hydra looks for it
(code: launchers/hydra_app/optuna_sweeper.py). Hydra imports this at every start.
"""
from launchers.hydra_app.optuna_sweeper import SearchSweeper


class OptunaSweeper(SearchSweeper):
    """``hydra/sweeper=mdk_optuna`` (docs/cluster.md, "Searches")."""
