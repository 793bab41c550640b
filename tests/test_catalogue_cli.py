"""Catalogue (docs/errors.md) entries that need a real `python run.py` process: the real command
does what ``cli()`` (tests/helpers/catalogue.py) shows in-process (status 1, one stderr line, no
traceback)."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from conftest import REPO, run_cmd_env
from helpers.catalogue import CLASSES, argv_of, one_error_line, proc, voc, voc_args  # noqa: F401
from helpers.catalogue import voc_master  # noqa: F401  (fixture)
from mdk.compose import one_line


def test_real_command_model_value_error_is_one_line(tmp_path):
    """A ValueError of the model's class at build time (Hydra would print its five-line
    "Error in call to target" block) is mdk's one line, before any stage."""
    p = proc(tmp_path, "model.image_size=100")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        "config error: model.image_size=100 must be divisible by 2^5 = 32 (the model has 5 2x2 "
        "max-pools): e.g. 96 or 128"]
    assert not (tmp_path / "ck").exists()


def test_real_command_user_error_is_one_line_and_status_1(tmp_path):
    p = proc(tmp_path, "step=step3")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        f"missing stage input: step3 starts from cal's result but {tmp_path / 'ck'}/cal/best.pth "
        "does not exist. Run `python run.py step=cal` first (with the same model/dataset/paths), "
        "or the whole chain with `python run.py pipeline=[step1,step2,cal,step3]`"]
    assert not (tmp_path / "ck").exists()  # nothing was created either


def test_real_command_hydra_full_error_shows_the_traceback(tmp_path):
    p = proc(tmp_path, "trainer.batch_size=0", env={"HYDRA_FULL_ERROR": "1"})
    assert p.returncode == 1
    assert "Traceback" in p.stderr and "BadValue: trainer.batch_size=0 must be an integer >= 1" in p.stderr


def test_real_command_nan_loss_stops_and_keeps_last_good(tmp_path):
    p = proc(tmp_path, "trainer.checkpoint_every_iters=1", "trainer.limit_train_batches=2",
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
    p = proc(tmp_path, f"paths.checkpoints={ck}")
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
