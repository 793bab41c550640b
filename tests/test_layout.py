"""The code's floors and owners (docs/architecture.md), checked on the source so they stay true.

* the import graph (every import, at module top or inside a function; tests/import_graph.py)
  has no cycle, and no module imports one on a higher floor (``FLOORS``, from the ground up);
  ``mdk`` (the library) never imports ``launchers`` (how processes start);
* an import inside a function says why on its line or the line above its block (an optional
  heavy package, a start-up cost); a package's ``__init__.py`` is a docstring, importing nothing;
* one owner per concept: Hydra composition only in mdk/compose.py, the process environment
  (RANK, LOCAL_RANK, WORLD_SIZE, SLURM_*) only in launchers/processes/env.py, the checkpoint file
  names only in the stage checkpointer, a stage's name in no Python file;
* one meaning per file name: no two Python files under mdk/ and launchers/ share a name, but for
  the names of a role every package may have (``ROLES``);
* small files: at most 300 lines of Python each;
* the libraries are used, not changed: nothing in mdk/ or launchers/ assigns to, deletes, wraps,
  ``setattr``s or patches an attribute of Hydra, OmegaConf, torch or submitit (but torch's
  documented ``torch.backends`` settings), and Hydra's private modules are imported in one
  module only, read-only (tests/library_patches.py reads the source).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import import_graph as ig
from library_patches import library_patches
from conftest import REPO

LIBRARY = sorted((REPO / "mdk").rglob("*.py"))
LAUNCHERS = sorted(p for p in (REPO / "launchers").rglob("*.py") if "plugins" not in p.parts)
CODE = LIBRARY + LAUNCHERS + [REPO / "run.py"]
PLUGINS = sorted((REPO / "launchers" / "plugins").rglob("*.py"))  # Hydra's entry points to ours
HYDRA_INTERNALS = "launchers/hydra_app/hydra_internals.py"  # the one reader of hydra._internal
# From the ground up; a module's floor is the first whose patterns match it or its package.
FLOORS = [
    # leaves: the errors, the stop flag, and each config group's words, schema and checks
    ["mdk", "mdk.errors", "mdk.stop", "mdk.checks", "mdk.targets", "mdk.paths", "mdk.dist_config",
     "mdk.trainer_config", "mdk.stage_config", "mdk.*.config", "mdk.quant.chips"],
    # the registry of schemas, composition, the process world and its collectives, files, bars
    ["mdk.schema", "mdk.config_keys", "mdk.compose", "mdk.world", "mdk.dist", "mdk.sync_bn", "mdk.faults",
     "mdk.checkpoint.files", "mdk.atomic_file", "mdk.folder_lock", "mdk.progress"],
    ["mdk.quant", "mdk.sched", "mdk.models"],             # what a model is and how it learns
    # data, measures, sinks, stage records and a stage's calibration node (read through conf/)
    ["mdk.data", "mdk.eval", "mdk.sinks", "mdk.stage", "mdk.calibration_config"],
    # checks and checkpoints of a run: the rest of mdk/checkpoint/ (where a stage starts, what a
    # checkpoint means, files of other tools read and written)
    ["mdk.checkpoint", "mdk.config", "mdk.preflight"],
    ["mdk.engine"],                                       # one stage in one process
    # command-line tools on the library; the quantization report's measures (they reuse the
    # evaluate tool's loaders)
    ["mdk.tools", "mdk.insight"],
    ["launchers", "launchers.processes", "launchers.bootstrap"],  # how ranks start and meet
    ["launchers.reports"],                                # what a run and a sweep print
    ["launchers.hydra_app", "launchers.align"],           # the command line around Hydra
    ["run"],
]
# A file name every package may use for the same role: its face, its config group's owner, its
# builders from config, its base class.
ROLES = {"__init__.py", "config.py", "build.py", "base.py"}


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _graph() -> dict[str, set[str]]:
    return ig.import_graph(CODE, REPO)


def _code(p: Path) -> str:
    """The source without comments and docstrings (what runs)."""
    tree = ast.parse(p.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(getattr(body[0], "value", None), ast.Constant) and \
                isinstance(body[0].value.value, str):
            body[0].value.value = ""
    return ast.unparse(tree)


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    assert len(graph) == len(CODE) and sum(map(len, graph.values())) > 300  # the real graph
    assert ig.cycles(graph) == []


def test_no_import_goes_up_a_floor():
    assert ig.upward(_graph(), FLOORS) == []


def test_the_library_never_imports_the_launchers():
    bad = [f"{a} -> {b}" for a, targets in _graph().items() for b in targets
           if a.startswith("mdk") and b.startswith("launchers")]
    assert bad == []


def test_the_checks_catch_a_planted_cycle_and_a_planted_upward_import(tmp_path):
    """The graph sees imports inside functions too: that is where cycles hide."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""a package"""\n')
    (pkg / "low.py").write_text("import os\n\n\ndef f():\n    from pkg import high  # planted\n")
    (pkg / "high.py").write_text("from pkg.low import f\n")
    (pkg / "mid.py").write_text("X = 1\n")
    graph = ig.import_graph(sorted(pkg.glob("*.py")), tmp_path)
    assert ig.cycles(graph) == [["pkg.high", "pkg.low"]]
    assert ig.upward(graph, [["pkg", "pkg.low"], ["pkg.mid"], ["pkg.high"]]) == [
        "pkg.low -> pkg.high"]


def test_imports_inside_functions_say_why():
    bad = [line for p in CODE for line in ig.unexplained_local_imports(p)]
    assert bad == []


def test_package_faces_import_nothing():
    """A package's ``__init__.py`` is its docstring: importing a config leaf never runs a heavy
    package (mdk.schema loads before Hydra composes, torch-free)."""
    bad = [_rel(p) for p in CODE if p.name == "__init__.py" and any(
        isinstance(n, (ast.Import, ast.ImportFrom)) and not (
            isinstance(n, ast.ImportFrom) and n.module == "__future__")
        for n in ast.walk(ast.parse(p.read_text())))]
    assert bad == []


@pytest.mark.parametrize("pattern, owner", [
    (r"\bhydra\.compose\b|\binitialize_config_dir\b|from hydra import [^\n]*\bcompose\b",
     ["mdk/compose.py"]),
    (r"[\"'](RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|SLURM_PROCID|SLURM_NTASKS)[\"']",
     ["launchers/processes/env.py"]),
    (r"[\"'](best|last)\.pth[\"']", ["mdk/checkpoint/layout.py"]),
    (r"[\"'](step[0-4]|cal)[\"']", []),
], ids=["composition", "process-environment", "checkpoint-names", "stage-names"])
def test_one_owner_per_concept(pattern, owner):
    where = sorted(_rel(p) for p in CODE if re.search(pattern, _code(p)))
    assert where == owner


def test_no_two_files_share_a_name_with_different_meanings():
    where: dict[str, list[str]] = {}
    for p in CODE:
        if p.name not in ROLES and p != REPO / "run.py":
            where.setdefault(p.name, []).append(_rel(p))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_files_stay_small():
    big = {_rel(p): n for p in CODE if (n := len(p.read_text().splitlines())) > 300}
    assert big == {}


def test_no_library_is_patched_and_hydras_insides_are_read_in_one_module():
    found = {f"{_rel(p)}: {what}" for p in CODE + PLUGINS for _, what in library_patches(p)}
    assert found == {
        f"{HYDRA_INTERNALS}: imports hydra._internal.core_plugins.basic_launcher.BasicLauncher",
        f"{HYDRA_INTERNALS}: imports hydra._internal.core_plugins.basic_sweeper.BasicSweeper"}
    assert len(CODE + PLUGINS) > 170  # every file was read


def test_the_patch_check_catches_planted_patches_and_passes_plain_use(tmp_path):
    planted = """import importlib
import torch
import torch.distributed.elastic.rendezvous.dynamic_rendezvous as rdzv
from hydra._internal import defaults_list as hydra_defaults
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf, DictConfig
from torch import nn

{RDZV_NAME} = lambda depth=2: "x"
{DEFAULTS_LIST} = wrap(hydra_defaults._create_defaults_list)
ConfigStore.store, other = wrap(ConfigStore.store), 1
setattr(OmegaConf, "merge", wrap(OmegaConf.merge))
store_class = ConfigStore
store_class.load = None
sub = importlib.import_module("submitit.core.core")
del sub.Job.results
monkeypatch.setattr("torch.load", fake)
mock.patch.object(nn.Module, "train", fake)
torch.nn.functional.relu += 1
{DEEPCOPY} = None
torch.backends.cudnn.benchmark = True
cfg = OmegaConf.create({{"a": 1}})
cfg.a = 2
model = nn.Linear(1, 1)
model.weight = nn.Parameter(torch.zeros(1, 1))
setattr(model, "bias", None)
os.environ["RANK"] = "0"
"""
    # The patches are filled in, so that no line of this file is itself a patch's form.
    planted = planted.format(RDZV_NAME="rdzv." + "get_method_name",
                             DEFAULTS_LIST="hydra_defaults." + "_create_defaults_list",
                             DEEPCOPY="DictConfig." + "__deepcopy__")
    found = library_patches(tmp_path / "planted.py", planted)
    assert found == [
        (4, "imports hydra._internal.defaults_list"),
        (9, "assigns to torch.distributed.elastic.rendezvous.dynamic_rendezvous.get_method_name"),
        (10, "assigns to hydra._internal.defaults_list._create_defaults_list"),
        (11, "assigns to hydra.core.config_store.ConfigStore.store"),
        (12, "setattr(omegaconf.OmegaConf, ...)"),
        (14, "assigns to hydra.core.config_store.ConfigStore.load"),
        (16, "deletes submitit.core.core.Job.results"),
        (17, "monkeypatch.setattr(torch.load, ...)"),
        (18, "mock.patch.object(torch.nn.Module, ...)"),
        (19, "assigns to torch.nn.functional.relu"),
        (20, "assigns to omegaconf.DictConfig.__deepcopy__")]
