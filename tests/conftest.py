"""Shared test helpers: compose the real conf/ with a tiny CPU override, outputs in tmp dirs."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from launchers.bootstrap import add_plugin_path  # noqa: E402
from helpers import warm  # noqa: E402

# `python run.py ...` and `python -m mdk.tools...` started by tests fork from an interpreter that
# has imported torch and mdk once (tests/helpers/warm.py: the same process semantics, ~6 s less
# CPU each); MDK_TEST_COLD=1 starts every one fresh.
subprocess.Popen = warm.Popen

add_plugin_path()  # our submitit launchers, for compose tests and the jobs they start
from mdk.schema import register_schemas  # noqa: E402

register_schemas()  # typed config groups, for tests that compose conf/ with Hydra directly
pytest_plugins = ["slurm_fixture"]  # and chain_fixture: pytest_configure below

# A model and dataset small enough that a whole stage runs in seconds on one core, on the CPU
# even where CUDA exists (tests/README: gpu marks): conf/debug/tiny.yaml.
TINY = [
    "debug=tiny",
    "dataset.num_workers=0",  # in-process loading: tests can count and patch what is loaded
]


def compose(overrides: list[str]):
    """The real conf/ composed with ``overrides`` (mdk's one compose helper)."""
    from mdk.compose import compose as mdk_compose

    return mdk_compose(overrides)


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generated tiny dataset for the whole session (generation is deterministic)."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def tiny_cfg(tmp_path: Path, shared_data: Path):
    def make(*extra: str):
        return compose(TINY + [f"paths.data={shared_data}", f"paths.checkpoints={tmp_path}/ckpt",
                               *extra])
    return make


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tests run beside each other's subprocesses; keep them predictable
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _root_log_handlers() -> Iterator[None]:
    """Undo the root-logger handlers a test's in-process run added (a rank's console handler
    holds that test's captured stdout, closed once the test ends; a later test's log line would
    then print a logging traceback). pytest's own capture handlers are left to pytest."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in before and not type(h).__module__.startswith("_pytest"):
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


# tryfirst: pytest-xdist's worker reads the xdist_group marks in its own hook of this name, so
# ours must run before it whatever the order the plugins were registered in
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """One hook (a second function of this name would replace the first, silently):

    - groups for pytest-xdist's ``--dist loadgroup`` (tests/suite.py): a module's tests on one
      worker, so its module-scoped fixtures are made once; every SLURM test on the same worker, so
      the session has one cluster and one set of namespace hosts; the modules that read
      ``fitted_chain`` on one worker (it is trained once, and no worker waits for another's);
    - the groups with the most ``slow`` tests first: the workers take groups in this order, so the
      long ones start early and the short ones fill the end (no worker waits alone on one);
    - ``gpu`` tests run wherever CUDA exists, ``multigpu`` where 2+ GPUs do; elsewhere they are
      skipped with the reason (so a CPU CI run says what it did not check)."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    few = pytest.mark.skip(reason=f"needs 2+ CUDA GPUs for NCCL (this machine has {n})")
    groups: dict[pytest.Item, str] = {}
    slow: Counter = Counter()
    for item in items:
        module = item.module.__name__ if item.module is not None else item.nodeid
        group = groups[item] = ("slurm" if module.rpartition(".")[2].startswith("test_slurm")
                                else "fitted_chain" if "fitted_chain" in item.fixturenames
                                else module)
        item.add_marker(pytest.mark.xdist_group(group))
        slow[group] += item.get_closest_marker("slow") is not None
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(few)
        elif "gpu" in item.keywords and n < 1:
            item.add_marker(no_gpu)
    first: dict[str, int] = {}  # each group's first place in the collection
    for i, group in enumerate(groups.values()):
        first.setdefault(group, i)
    items.sort(key=lambda it: (-slow[groups[it]], first[groups[it]]))  # stable within a group


def pytest_configure(config: pytest.Config) -> None:
    # chain_fixture imports torch and mdk (about 10 s of CPU). pytest-xdist's controller runs no
    # test and starts its workers only after this: there it would be 10 s of one busy core
    # before any test. Registered here, its fixture is found as if listed in pytest_plugins.
    if not _xdist_controller(config):
        config.pluginmanager.import_plugin("chain_fixture")


def _xdist_controller(config: pytest.Config) -> bool:
    """This process hands tests to pytest-xdist workers (``-n N``) and runs none itself."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def run_cmd_env() -> dict:
    env = dict(os.environ, MDK_NO_BOOTSTRAP="1", PYTHONPATH=str(REPO))
    return env
