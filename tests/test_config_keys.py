"""A typo is not followed by a silent run (docs/errors.md #10, #131): a key a node does not declare
says what was probably meant, a ``+key`` nothing reads is refused in one line, and the nodes open by
design (``stages.<stage>``, ``trainer.hooks``, ``logger.sinks``, a reader's own keys) still take
new keys. Real ``python run.py`` commands for the lines a user sees; the rest in this process."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conftest import TINY, compose
from helpers.catalogue import proc
from mdk.compose import compose as mdk_compose
from mdk.config import validate
from mdk.config_keys import check_added_keys, is_open, schema_maps
from mdk.errors import ConfigError
from mdk.stage import config_for_stage

PIPELINE = "pipeline=[step1,step2,cal,step3]"


@pytest.mark.parametrize("override, line", [
    ("trainer.epoch=3", "trainer.epoch=3: trainer has no key 'epoch'; did you mean trainer.epochs?"),
    ("dist.gpu=2", "dist.gpu=2: dist has no key 'gpu'; did you mean dist.gpus?"),
    ("optim.lrr=0.01", "optim.lrr=0.01: optim has no key 'lrr'; did you mean optim.lr?"),
    ("dataset.num_clases=3",
     "dataset.num_clases=3: dataset has no key 'num_clases'; did you mean dataset.num_classes?"),
    ("dataset.readr.x=1", "dataset.readr.x=1: dataset has no key 'readr'; did you mean "
                          "dataset.reader?"),
    ("eval.metrc=coco", "eval.metrc=coco: eval has no key 'metrc'; did you mean eval.metric?"),
    ("scheduler.warmup.iter=2", "scheduler.warmup.iter=2: scheduler.warmup has no key 'iter'; "
                                "did you mean scheduler.warmup.iters?"),
    ("sead=1", "sead=1: the config has no key 'sead'; did you mean seed?"),
    ("eval.iou=0.5", "eval.iou=0.5: eval has no key 'iou'; its keys: python run.py --cfg job "
                     "--package eval"),
])
def test_a_typo_in_a_declared_key_says_what_was_meant(override, line):
    with pytest.raises(ConfigError) as e:
        compose(TINY + [override])
    assert str(e.value) == line


@pytest.mark.parametrize("override, advice", [
    ("stages.step3.epochs=12", "+stages.step3.epochs=12"),  # the per-stage map: add it
    ("trainer.hooks.mine={_target_:x.Y}", "+trainer.hooks.mine={_target_:x.Y}"),
    ("optim.betas=[0.9,0.99]", "+optim.betas=[0.9,0.99]"),  # an argument the optimizer takes
])
def test_where_new_keys_are_taken_hydras_advice_to_add_one_stays(override, advice):
    with pytest.raises(ConfigError, match=r"\(to append to your config use \+") as e:
        compose(TINY + [override])
    assert str(e.value).endswith(f"use {advice})")


@pytest.mark.parametrize("override, line", [
    ("+trainer.epoch=3", "+trainer.epoch=3: trainer has no key 'epoch' and nothing reads a new "
                         "one; did you mean trainer.epochs?"),
    ("+dist.gpu=2", "+dist.gpu=2: dist has no key 'gpu' and nothing reads a new one; did you mean "
                    "dist.gpus?"),
    ("+dataset.num_clases=3", "+dataset.num_clases=3: dataset has no key 'num_clases' and nothing "
                              "reads a new one; did you mean dataset.num_classes?"),
    ("+eval.iou=0.5", "+eval.iou=0.5: eval has no key 'iou' and nothing reads a new one; its "
                      "keys: python run.py --cfg job --package eval"),
    ("+eval.metrics=coco", "+eval.metrics=coco: eval has no key 'metrics' and nothing reads a new "
                           "one; did you mean eval.metric?"),
    ("+trainer.foo.bar=1", "+trainer.foo.bar=1: trainer has no key 'foo' and nothing reads a new "
                           "one; its keys: python run.py --cfg job --package trainer"),
    ("+foo=1", "+foo=1: the config has no key 'foo' and nothing reads a new one; its keys: "
               "python run.py --cfg job"),
])
def test_a_plus_key_nothing_reads_is_refused(override, line):
    over = TINY + [override]
    cfg = compose(over)
    with pytest.raises(ConfigError) as e:
        check_added_keys(cfg, over)
    assert str(e.value) == line


def test_a_key_added_to_a_typed_node_any_other_way_is_refused_too():
    """``++`` (add or override) and a config with no command line to read: the schema decides."""
    cfg = compose(TINY + ["++trainer.epoch=3"])
    with pytest.raises(ConfigError, match=r"^trainer\.epoch: trainer has no key 'epoch' and "
                                          r"nothing reads a new one; did you mean trainer\.epochs\?$"):
        validate(cfg)


def test_the_nodes_open_by_design_keep_taking_new_keys():
    over = TINY + [PIPELINE, "+stages.step3.epochs=12", "+stages.step3.lr_scale=0.25",
                   "+trainer.hooks.mine={_target_:mdk.engine.ema_hook.EMAHook}",
                   "+logger.sinks.tensorboard.flush_secs=5", "+dataset.reader.strict=true"]
    cfg = compose(over)
    check_added_keys(cfg, over)
    assert config_for_stage(cfg, "step3").trainer.epochs == 12
    assert cfg.trainer.hooks.mine._target_ == "mdk.engine.ema_hook.EMAHook"
    assert cfg.dataset.reader.strict is True
    assert schema_maps() == {"trainer.hooks", "logger.sinks"}
    assert is_open("stages.step3") and is_open("dataset.reader", cfg.dataset.reader)
    assert not is_open("trainer", cfg.trainer) and not is_open("eval", cfg.eval)
    assert not is_open("")  # the root config


def test_a_plus_key_nothing_reads_is_refused_by_validate_inside_the_app(tmp_path):
    """validate reads the command's overrides from the config's own hydra node (a sweep job's,
    checked before any job starts) and refuses the first key nothing reads."""
    cfg = mdk_compose(TINY + ["+eval.iou=0.5"], hydra_config=True)
    assert list(cfg.hydra.overrides.task)[-1] == "+eval.iou=0.5"
    with pytest.raises(ConfigError, match=r"^\+eval\.iou=0\.5: eval has no key 'iou'"):
        validate(cfg)
    fine = mdk_compose(TINY + [PIPELINE, "+stages.step3.epochs=12"], hydra_config=True)
    validate(fine)
    assert OmegaConf.select(fine, "stages.step3.epochs") == 12


@pytest.mark.parametrize("override, line", [
    ("trainer.epoch=3", "config error: trainer.epoch=3: trainer has no key 'epoch'; did you mean "
                        "trainer.epochs?"),
    ("+trainer.epoch=3", "config error: +trainer.epoch=3: trainer has no key 'epoch' and nothing "
                         "reads a new one; did you mean trainer.epochs?"),
    ("+dataset.num_clases=3", "config error: +dataset.num_clases=3: dataset has no key "
                              "'num_clases' and nothing reads a new one; did you mean "
                              "dataset.num_classes?"),
])
def test_run_py_says_what_was_meant_and_refuses_a_key_nothing_reads(tmp_path, override, line):
    p = proc(tmp_path, override)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == line
    assert not (tmp_path / "ck").exists() and not (tmp_path / "data").exists()  # nothing ran
