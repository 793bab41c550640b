"""World-size-invariant calibration: the caps depend on the images, not on how a global batch is
split over ranks. step=cal on 1 and on 2 processes writes the same caps, bit for bit, with every
method, also where the strided sample's positions straddle the ranks' slices."""
from __future__ import annotations

import json
import shutil

import pytest

from launchers.processes.spawn import run_ranks
from mdk.config import validate
from mdk.engine.runner import run_stage, stage_on_rank
from mdk.errors import ConfigError
from mdk.calibration_config import calibration_node
from mdk.quant.calibrate import KlCap, MseCap, PercentileCap, rank_share
from mdk.stage import config_for_stage
from helpers.ddp import tiny_cfg

# (method, max_values): 10007 is odd and prime, so the sample stride is > 1 on the tiny model's
# larger layers and its positions fall across the boundary of the two ranks' slices
CASES = [("percentile", 10007), ("percentile", None), ("max", None), ("mse", None),
         ("kl", 10007), ("kl", None)]
CLASSES = {"percentile": "PercentileCap", "max": "MaxCap", "mse": "MseCap", "kl": "KlCap"}
SAMPLED = ("percentile", "kl")  # the methods that take max_values (max reads all, mse its own)


def test_rank_shares_are_the_global_positions():
    for n, stride, world in [(10, 3, 2), (7, 7, 3), (1000, 10007, 4), (12, 1, 2), (9, 4, 3)]:
        got = []
        for r in range(world):
            start, counts = rank_share(n, stride, r, world)
            mine = list(range(r * n + start, (r + 1) * n, stride))
            assert len(mine) == counts[r]
            got += mine
        assert got == list(range(0, n * world, stride))


@pytest.fixture(scope="module")
def step2_done(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calworld")
    base = tiny_cfg(tmp, "trainer.epochs=1", "trainer.limit_train_batches=2")
    (tmp / "run").mkdir()
    for s in ("step1", "step2"):
        run_stage(config_for_stage(base, s), tmp / "run")
    return tmp


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.parametrize("method,max_values", CASES)
def test_cal_caps_are_bit_identical_on_1_and_2_processes(step2_done, tmp_path, method, max_values):
    caps = []
    for world in (1, 2):
        ck = tmp_path / f"ck{world}"
        shutil.copytree(step2_done / "ck", ck)
        mv = "null" if max_values is None else max_values
        sampled = [f"step.calibration.max_values={mv}"] if method in SAMPLED else []
        cfg = tiny_cfg(step2_done, "step=cal", f"paths.checkpoints={ck}", f"dist.gpus={world}",
                       "dist.cpu_threads=1", f"step/calibration={method}", *sampled)
        run_ranks(config_for_stage(cfg, "cal"), tmp_path / f"run{world}", stage_on_rank)
        doc = json.loads((ck / "cal" / "caps.json").read_text())
        assert doc["meta"]["world_size"] == world
        assert doc["meta"]["method"] == f"mdk.quant.calibrate.{CLASSES[method]}"
        assert doc["meta"].get("max_values", "absent") == (max_values if sampled else "absent")
        caps.append([layer["cap"] for layer in doc["layers"]])
    one, two = caps
    assert all(c > 0 for c in one)
    assert one == two  # exact float equality, every layer


@pytest.mark.parametrize("word,cls,key,value", [("percentile", PercentileCap, "percentile", 0),
                                                ("percentile", PercentileCap, "max_values", 0),
                                                ("kl", KlCap, "max_values", 0),
                                                ("mse", MseCap, "mse_candidates", 0)])
def test_a_bad_calibration_value_is_one_config_error_before_anything_runs(tmp_path, word, cls, key,
                                                                           value):
    node = f"{{_target_:{cls.__module__}.{cls.__name__},{key}:{value}}}"  # a node inline
    for cmd in (["step=cal", f"step/calibration={word}", f"step.calibration.{key}={value}"],
                ["pipeline=[step1,step2,cal]", f"+stages.cal.calibration={node}"]):
        with pytest.raises(ConfigError) as e:
            validate(tiny_cfg(tmp_path, *cmd))
        assert f"step.calibration.{key}=" in str(e.value) and "(cal)" in str(e.value)
    # the default method's keys, set one by one
    if cls is PercentileCap:
        for cmd in (["step=cal", f"step.calibration.{key}={value}"],
                    ["pipeline=[step1,step2,cal]", f"+stages.cal.calibration.{key}={value}"]):
            with pytest.raises(ConfigError) as one:
                validate(tiny_cfg(tmp_path, *cmd))
            assert str(one.value) == str(e.value)
    # the method's class checks with the same code: the same line, without the stage
    with pytest.raises(ValueError) as direct:
        cls(**{key: value})
    assert str(direct.value) == str(e.value).replace(" (cal)", "")


def test_a_word_that_is_no_method_is_one_config_error_before_anything_runs(tmp_path):
    for cmd, key in ((["step=cal", "step.calibration=entropy"], "step.calibration"),
                     (["pipeline=[step1,step2,cal]", "+stages.cal.calibration=entropy"],
                      "step.calibration"),
                     (["step=cal", "+step.calibration.method=entropy"], "step.calibration.method"),
                     (["pipeline=[step1,step2,cal]", "+stages.cal.calibration.method=entropy"],
                      "step.calibration.method")):
        with pytest.raises(ConfigError) as e:
            validate(tiny_cfg(tmp_path, *cmd))
        assert str(e.value) == (f"{key}='entropy' (cal) is not a calibration method; use one of "
                                "kl, max, mse, percentile (step/calibration=<name>; in a pipeline "
                                "+stages.<stage>.calibration=<name>) or step.calibration._target_="
                                "pkg.module.Name of a mdk.quant.calibrate.CapObserver subclass")
    with pytest.raises(ConfigError) as direct:  # the reader says the same, without the stage
        calibration_node({"method": "entropy"})
    assert str(direct.value) == str(e.value).replace(" (cal)", "")
    with pytest.raises(ConfigError, match=r"^step.calibration._target_='builtins.dict' \(cal\) is "
                       "not a calibration method; use one of kl, max"):
        validate(tiny_cfg(tmp_path, "step=cal", "step.calibration._target_=builtins.dict"))
    with pytest.raises(ConfigError, match=r"^In 'step/cal': Could not find "
                       r"'step/calibration/entropy'; Available options in 'step/calibration': "
                       "kl, max, mse, percentile$"):
        tiny_cfg(tmp_path, "step=cal", "step/calibration=entropy")  # Hydra's own line


def test_a_calibration_class_that_cannot_be_imported_is_one_config_error(tmp_path):
    hint = ("give pkg.module.Name of a mdk.quant.calibrate.CapObserver subclass, or name an option "
            "of conf/step/calibration/ (step/calibration=<name>; in a pipeline "
            "+stages.<stage>.calibration=<name>)")
    for cmd, key in (("step.calibration._target_=nosuch.Cap", "step.calibration._target_"),
                     ("+step.calibration.method=nosuch.Cap", "step.calibration.method")):
        with pytest.raises(ConfigError) as e:
            validate(tiny_cfg(tmp_path, "step=cal", cmd))
        assert str(e.value) == (f"{key}='nosuch.Cap' cannot be imported (No module named "
                                f"'nosuch'); {hint}")
