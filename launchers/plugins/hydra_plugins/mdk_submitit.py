"""The project's submitit launchers, declared where Hydra looks for them (code:
launchers/hydra_app/submitit_requeue.py). No ``__init__.py`` here: the ``hydra_plugins``
namespace is shared with the installed hydra-submitit-launcher plugin.
"""
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

from launchers.hydra_app.submitit_requeue import RequeueMixin


class SlurmLauncher(RequeueMixin, BaseSubmititLauncher):
    """``hydra/launcher=submitit_slurm``: the plugin's SLURM launcher + same-dir requeue/resume."""

    _EXECUTOR = "slurm"


class LocalLauncher(RequeueMixin, BaseSubmititLauncher):
    """``hydra/launcher=submitit_local``: the plugin's local launcher + the same requeue/resume."""

    _EXECUTOR = "local"
