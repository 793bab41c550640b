"""mdk entry point: `python run.py [group=option ...] [key=value ...]` (see README.md).

On first use this installs what it needs into ./.venv and re-runs itself there.
"""
from launchers.bootstrap import ensure_environment
from launchers.malloc import tune_malloc
from launchers.plugin_path import add_plugin_path

ensure_environment()
tune_malloc()  # before torch allocates anything; see launchers/malloc.py
add_plugin_path()  # our submitit launchers (Hydra takes launchers only from hydra_plugins.*)

import warnings  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

# Our conf/hydra/launcher presets share the submitit plugin's names on purpose (so
# `hydra/launcher=submitit_slurm` picks them); Hydra 1.3 warns about that on every run.
warnings.filterwarnings("ignore", message=r"(?s).*validated against ConfigStore schema with the same name",
                        category=UserWarning)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> list:
    from launchers.entry import run

    return run(cfg)


if __name__ == "__main__":
    main()
    from launchers.env import leave_torchrun_rank

    leave_torchrun_rank()
