"""The code's floors and owners (docs/architecture.md), checked on the source so they stay true.

* ``mdk`` (the library) never imports ``launchers`` (how processes start);
* the lower floors (data, models, quant, sched, eval, sinks) import neither the engine nor the
  command-line tools, and the engine does not import the tools;
* one owner per concept: Hydra composition only in mdk/compose.py, the process environment
  (RANK, LOCAL_RANK, WORLD_SIZE, SLURM_*) only in launchers/processes/env.py, the checkpoint file
  names only in the stage checkpointer;
* small files: at most 300 lines of Python each.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

LIBRARY = sorted((REPO / "mdk").rglob("*.py"))
CODE = LIBRARY + sorted((REPO / "launchers").rglob("*.py")) + [REPO / "run.py"]
LOWER = ("data", "models", "quant", "sched", "eval", "sinks")


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _imports(p: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(p.read_text(), str(p))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


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


def test_the_library_never_imports_the_launchers():
    bad = {_rel(p): sorted(m for m in _imports(p) if m.split(".")[0] == "launchers")
           for p in LIBRARY}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_import_goes_up_a_floor():
    bad = {}
    for p in LIBRARY:
        parts = p.relative_to(REPO / "mdk").parts
        up: tuple[str, ...] = ()
        if parts[0] in LOWER:
            up = ("mdk.engine", "mdk.tools")
        elif parts[0] == "engine":
            up = ("mdk.tools",)
        hits = sorted(m for m in _imports(p) if m.startswith(up)) if up else []
        if hits:
            bad[_rel(p)] = hits
    assert bad == {}


@pytest.mark.parametrize("pattern, owner", [
    (r"\bhydra\.compose\b|\binitialize_config_dir\b|from hydra import [^\n]*\bcompose\b",
     "mdk/compose.py"),
    (r"[\"'](RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|SLURM_PROCID|SLURM_NTASKS)[\"']",
     "launchers/processes/env.py"),
    (r"[\"'](best|last)\.pth[\"']", "mdk/stage_checkpoint.py"),
], ids=["composition", "process-environment", "checkpoint-names"])
def test_one_owner_per_concept(pattern, owner):
    where = sorted(_rel(p) for p in CODE if re.search(pattern, _code(p)))
    assert where == [owner]


def test_files_stay_small():
    big = {_rel(p): n for p in CODE if (n := len(p.read_text().splitlines())) > 300}
    assert big == {}
