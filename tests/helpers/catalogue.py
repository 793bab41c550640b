"""Helpers of the catalogue tests (docs/errors.md): ``cli()`` calls run.py's Hydra main in this
process (sub-second instead of a fresh interpreter each): a user error arrives as
``SystemExit("<one line>")``, which the interpreter prints to stderr with exit status 1; ``cli()``
returns exactly that. Also file snapshots, a tiny VOC folder and ``proc`` (a real process)."""
from __future__ import annotations

import hashlib
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cmd_env

CLASSES = "dataset.class_names=[circle,square,triangle,star,cross]"
TINY_CLI = ["debug=tiny_model", "trainer.epochs=1", "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1"]
SHAPES = ["dataset.generate.num_train=16", "dataset.generate.num_val=8"]


def argv_of(tmp: Path, args: tuple[str, ...]) -> list[str]:
    data = [] if any(a.startswith("dataset=") and a != "dataset=shapes" for a in args) else SHAPES
    return [*TINY_CLI, *data, f"paths.data={tmp / 'data'}", f"paths.checkpoints={tmp / 'ck'}",
            f"hydra.run.dir={tmp / 'run'}", *args]


def cli(tmp: Path, *args: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python run.py <TINY_CLI> <args>`, run in-process."""
    argv = ["run.py", *argv_of(tmp, args)]
    old = sys.argv
    sys.argv = argv
    status, extra = 0, ""
    os.environ["MDK_NO_BOOTSTRAP"] = "1"
    try:
        # As `python run.py`: Hydra finds conf/ next to the file of a __main__ task function.
        runpy.run_path(str(REPO / "run.py"), run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):
            status, extra = 1, e.code + "\n"
        else:
            status = int(e.code or 0)
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return status, out.out, out.err + extra


def snapshot(*dirs: Path) -> dict[Path, str]:
    """sha256 of every file under ``dirs`` (to prove no existing file was damaged)."""
    return {p: hashlib.sha256(p.read_bytes()).hexdigest()
            for d in dirs if Path(d).exists() for p in sorted(Path(d).rglob("*")) if p.is_file()}


def assert_intact(before: dict[Path, str], moved: dict[Path, Path] | None = None) -> None:
    moved = moved or {}
    for p, sha in before.items():
        q = moved.get(p, p)
        assert q.is_file(), f"{q} is gone"
        assert hashlib.sha256(q.read_bytes()).hexdigest() == sha, f"{q} changed"


def one_error_line(status: int, err: str, *needles: str) -> str:
    """Exit status 1 and a stderr whose last line carries every needle; no traceback."""
    assert status == 1, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    line = err.strip().splitlines()[-1]
    for n in needles:
        assert n in line, f"{n!r} not in {line!r}"
    return line


@pytest.fixture(scope="session")
def voc_master(tmp_path_factory) -> Path:
    """A tiny VOC-layout folder (the built-in generator's output), generated once."""
    from mdk.data.shapes import ensure_shapes_dataset

    root = tmp_path_factory.mktemp("voc") / "VOC"
    ensure_shapes_dataset(root, num_train=16, num_val=8, image_size=64, seed=0,
                          class_names=["circle", "square", "triangle", "star", "cross"])
    return root


@pytest.fixture
def voc(voc_master, tmp_path) -> Path:
    """A private copy to break, plus the overrides that read it with dataset=voc."""
    root = tmp_path / "VOC"
    shutil.copytree(voc_master, root)
    return root


def voc_args(root: Path) -> list[str]:
    return ["dataset=voc", f"dataset.root={root}", "dataset.train_split=train",
            "dataset.val_split=val", CLASSES, "dataset.num_classes=5", "dataset.num_workers=0"]


def proc(tmp: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run.py"), *argv_of(tmp, args)], cwd=REPO,
                          env=dict(run_cmd_env(), OMP_NUM_THREADS="1", **(env or {})),
                          capture_output=True, text=True, timeout=300)
