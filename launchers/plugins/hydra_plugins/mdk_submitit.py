"""Hydra discovers launcher plugins only inside the ``hydra_plugins`` namespace package (and refuses
any other ``_target_`` for ``hydra/launcher``), so the project's submitit launchers are declared
here; their code lives in ``launchers/hydra_app/submitit_requeue.py``. No ``__init__.py`` in this
folder: it must stay a namespace package shared with the installed hydra-submitit-launcher plugin.
"""
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

from launchers.hydra_app.submitit_requeue import RequeueMixin


class SlurmLauncher(RequeueMixin, BaseSubmititLauncher):
    """``hydra/launcher=submitit_slurm``: the plugin's SLURM launcher + same-dir requeue/resume."""

    _EXECUTOR = "slurm"


class LocalLauncher(RequeueMixin, BaseSubmititLauncher):
    """``hydra/launcher=submitit_local``: the plugin's local launcher + the same behaviour."""

    _EXECUTOR = "local"
