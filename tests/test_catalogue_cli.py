"""Catalogue (docs/errors.md) helpers, and the entries that need a real `python run.py` process.

Most catalogue tests call run.py's Hydra main in this process (sub-second instead of a fresh
interpreter each): a user error arrives as ``SystemExit("<one line>")``, which the interpreter
prints to stderr with exit status 1; ``cli()`` returns exactly that. The subprocess tests here
check that the real command does the same (status 1, one stderr line, no traceback).
"""
from __future__ import annotations

import hashlib
import os
import runpy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from conftest import REPO, run_cmd_env
from mdk.compose import one_line

CLASSES = "dataset.class_names=[circle,square,triangle,star,cross]"
TINY_CLI = [
    "model.image_size=64", "model.net.channels=[8,M,8,M,8,M,8,M,8,M,8]",
    "model.net.mask_bits=[3,3,3,3,3,3,8]", "logger=none",
    "trainer.progress=false", "trainer.batch_size=8", "trainer.epochs=1",
    "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.device=cpu",
]
SHAPES = ["dataset.generate.num_train=16", "dataset.generate.num_val=8",
          "dataset.generate.image_size=64"]


def _argv(tmp: Path, args: tuple[str, ...]) -> list[str]:
    data = [] if any(a.startswith("dataset=") and a != "dataset=shapes" for a in args) else SHAPES
    return [*TINY_CLI, *data, f"paths.data={tmp / 'data'}", f"paths.checkpoints={tmp / 'ck'}",
            f"hydra.run.dir={tmp / 'run'}", *args]
def cli(tmp: Path, *args: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python run.py <TINY_CLI> <args>`, run in-process."""
    argv = ["run.py", *_argv(tmp, args)]
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


# ---- entries that run the real command --------------------------------------------------------

def _proc(tmp: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run.py"), *_argv(tmp, args)], cwd=REPO,
                          env=dict(run_cmd_env(), OMP_NUM_THREADS="1", **(env or {})),
                          capture_output=True, text=True, timeout=300)


def test_real_command_model_value_error_is_one_line(tmp_path):
    """A ValueError of the model's class at build time (Hydra would print its five-line
    "Error in call to target" block) is mdk's one line, before any stage."""
    p = _proc(tmp_path, "model.image_size=100")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        "config error: model.image_size=100 must be divisible by 2^5 = 32 (the model has 5 2x2 "
        "max-pools): e.g. 96 or 128"]
    assert not (tmp_path / "ck").exists()


def test_real_command_user_error_is_one_line_and_status_1(tmp_path):
    p = _proc(tmp_path, "step=step3")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        f"missing stage input: step3 starts from cal's result but {tmp_path / 'ck'}/cal/best.pth "
        "does not exist. Run `python run.py step=cal` first (with the same model/dataset/paths), "
        "or the whole chain with `python run.py pipeline=[step1,step2,cal,step3]`"]
    assert not (tmp_path / "ck").exists()  # nothing was created either


def test_real_command_hydra_full_error_shows_the_traceback(tmp_path):
    p = _proc(tmp_path, "trainer.batch_size=0", env={"HYDRA_FULL_ERROR": "1"})
    assert p.returncode == 1
    assert "Traceback" in p.stderr and "ConfigError: trainer.batch_size=0 must be >= 1" in p.stderr


def test_real_command_nan_loss_stops_and_keeps_last_good(tmp_path):
    p = _proc(tmp_path, "trainer.checkpoint_every_iters=1", "trainer.limit_train_batches=2",
              env={"MDK_FAULT": "nan:iter:2"})
    line = one_error_line(p.returncode, p.stderr, "training stopped: loss is not finite at "
                          "iteration 2: term(s) [", "'total'] = [nan, nan]", "last good checkpoint")
    assert line.count("\n") == 0
    import torch

    last = torch.load(tmp_path / "ck" / "step1" / "last.pth", weights_only=False)
    assert last["trainer"]["iter"] == 1 and all(bool(torch.isfinite(v).all()) for v in last["model"].values()
                                     if v.is_floating_point())


def test_real_command_unparsable_override_says_how_to_quote_it(tmp_path):
    ck = tmp_path / "ck ü"
    p = _proc(tmp_path, f"paths.checkpoints={ck}")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        f"config error: could not parse the override paths.checkpoints={ck} (at 'ü'): a value "
        "with characters other than ASCII letters, digits, spaces and _-+./:@$%*?| must be "
        f"quoted, e.g. 'paths.checkpoints=\"{ck}\"'"]
    assert not ck.exists()


@pytest.mark.parametrize("override", [
    "paths.checkpoints=/data/ck ü", "paths.checkpoints=/d/[x]", 'paths.checkpoints=/d/x"y',
    "paths.checkpoints=/d/x'y", "x=ab'c\"d", "+stages.step3.x=ö", "x=ü\\"])
def test_the_quoted_form_of_an_unparsable_value_parses_to_that_value(override):
    parser = OverridesParser.create()
    with pytest.raises(OverrideParseException) as e:
        parser.parse_overrides([override])
    advice = one_line(e.value)
    assert advice.startswith(f"could not parse the override {override} (at ")
    typed = shlex.split(advice.split(", e.g. ", 1)[1])  # what the shell hands Python
    assert len(typed) == 1
    key, value = override.split("=", 1)
    parsed = parser.parse_overrides(typed)[0]
    assert parsed.get_key_element().lstrip("+") == key.lstrip("+") and parsed.value() == value


@pytest.mark.parametrize("override, advice", [
    ("a b=1", "could not parse the override a b=1 (at ' '): a key is a dotted name"),
    ("trainer.epochs", "could not parse the override trainer.epochs: write key=value"),
    ("pipeline=[step1,stüp]", "(at 'ü'): a list is written [a,b] and a dict {a:1,b:2}; quote an "
                              "item"),
])
def test_an_unparsable_key_or_list_gets_its_own_advice(override, advice):
    with pytest.raises(OverrideParseException) as e:
        OverridesParser.create().parse_overrides([override])
    assert advice in one_line(e.value)
