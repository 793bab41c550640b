"""mdk entry point: `python run.py [group=option ...] [key=value ...]` (see README.md).

On first use this installs what it needs into ./.venv and re-runs itself there.
"""
from launchers.bootstrap import add_plugin_path, ensure_environment
from launchers.processes.malloc import tune_malloc

ensure_environment()
tune_malloc()  # before torch allocates anything; see launchers/processes/malloc.py
add_plugin_path()  # our submitit launchers (Hydra takes launchers only from hydra_plugins.*)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from launchers.hydra_app.cli import restore_full_error, run_cli  # noqa: E402
from launchers.processes.env import leave_torchrun_rank  # noqa: E402
from mdk.schema import register_schemas  # noqa: E402

register_schemas()  # typed config groups (mdk/schema.py), before Hydra composes


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> object:
    restore_full_error()
    from launchers.hydra_app.entry import run  # here: torch and the engine load only for a run

    return run(cfg)


if __name__ == "__main__":
    run_cli(main)
    leave_torchrun_rank()
