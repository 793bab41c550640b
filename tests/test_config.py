"""Every option of every group composes and instantiates; validation names the bad key."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hydra.utils import instantiate

from conftest import REPO, compose, run_cmd_env
from launchers.hydra_app.user_error_line import user_error_line
from mdk.data.class_names import fill_class_names
from mdk.config import validate
from mdk.errors import ConfigError
from mdk.models.build import build_model
from mdk.models.config import check_model
from mdk.calibration_config import observers
from mdk.quant.calibrate import CapObserver
from mdk.quant.chips import chip_takes
from mdk.sched.base import stage_length
from mdk.schema import SCHEMAS, schema_name

GROUPS = {
    "model": ["gnetdet", "gnetdet_224", "gnetdet_small"],
    "dataset": ["shapes", "shapes_hard", "voc", "coco", "yolo"],
    "step": ["step1", "step2", "cal", "step3", "step4", "quant_report"],
    "step/calibration": ["percentile", "max", "mse", "kl"],  # a group of the cal stage's record
    "scheduler": ["step", "multistep", "cosine", "cosine_restarts", "onecycle"],
    "optim": ["adamw", "sgd"],
    "loss": ["default", "gti", "anchors"],
    "head": ["yolov1", "anchors"],
    "dist": ["default"],
    "logger": ["tensorboard", "wandb", "none"],
    "trainer": ["default"],
    "paths": ["default"],
}


def test_group_folders_match_the_list():
    for group, options in GROUPS.items():
        found = sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))
        assert found == sorted(options), group


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_option_composes_and_validates(group, option, tmp_path):
    # a folder of your own: its class list is read from the data at the start of a run
    # (mdk.data.class_names, tested in test_data_class_names.py); here there is none, so given
    extra = (["dataset.root=" + str(tmp_path), "dataset.class_names=[a,b]"]
             if option in ("voc", "coco", "yolo") else [])
    if (group, option) == ("loss", "anchors"):
        extra.append("head=anchors")  # its loss reads the head's priors (refused with yolov1)
    stage = ["step=cal"] if group == "step/calibration" else []
    cfg = compose([*stage, f"{group}={option}", *extra])
    fill_class_names(cfg)   # as a run does before its checks: num_classes follows the list
    validate(cfg)
    if group == "step/calibration":
        made = observers(cfg.step.calibration)()
        assert isinstance(made, CapObserver) and type(made).__name__ == cfg.step.calibration[
            "_target_"].rsplit(".", 1)[1]
    if group in ("model", "head"):
        m = instantiate(cfg.model.net)
        out = m(torch.zeros(1, 3, cfg.model.image_size, cfg.model.image_size, dtype=torch.uint8))
        b, c = m.head.boxes_per_cell, cfg.dataset.num_classes
        width = b * (5 + c) if option == "anchors" else 5 * b + c
        assert out.shape == (1, width, m.grid, m.grid)
        pools = list(cfg.model.net.channels).count("M")
        assert m.grid == cfg.model.image_size // 2 ** pools == (14 if option == "gnetdet_224"
                                                                else cfg.model.image_size // 32)
    if group == "optim":
        opt = instantiate(cfg.optim)([torch.nn.Parameter(torch.zeros(2))])
        assert opt.param_groups[0]["lr"] == cfg.optim.lr
    if group == "loss":
        width = instantiate(cfg.model.net.head).channels
        terms = instantiate(cfg.loss)(torch.zeros(2, width, 6, 6), torch.zeros(2, 6, 6, width))
        assert "total" in terms and torch.isfinite(terms["total"])
    if group == "scheduler":
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
        sched = instantiate(cfg.scheduler)(optimizer=opt, iters_per_epoch=10,  # as the engine does
                                           **stage_length(cfg.scheduler, cfg.trainer.epochs))
        first = (1 / cfg.scheduler.div_factor if option == "onecycle"  # its rise is its warmup
                 else cfg.scheduler.warmup.start_factor)
        assert sched.get_last_lr()[0] == pytest.approx(first)


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_every_group_has_a_typed_schema_beside_its_owner(group):
    """Every YAML of a typed group is merged onto a schema its owner declares (mdk/schema.py)."""
    for path in sorted((REPO / "conf" / group).glob("*.yaml")):
        head = path.read_text().split("_self_")[0]
        named = [n for n in SCHEMAS[group] if f"/{schema_name(group, n)}@_here_" in head]
        assert len(named) == 1, path


# One key per group with a value of the wrong type: refused when the config is composed,
# in one line naming the key (the schema), before any check or work.
WRONG_TYPE = {"trainer": "trainer.epochs=abc", "dist": "dist.gpus=two", "paths": "paths.data=[1]",
              "step": "step.epochs=many", "scheduler": "scheduler.warmup.iters=x",
              "optim": "optim.weight_decay=lots", "model": "model.image_size=big",
              "loss": "loss.lambda_cls=high", "dataset": "dataset.num_classes=five",
              "logger": "logger.log_every=often", "head": "head.size_range=wide"}


@pytest.mark.parametrize("group", sorted(WRONG_TYPE))
def test_a_wrong_type_in_any_group_fails_at_compose_naming_the_key(group):
    assert set(WRONG_TYPE) == set(SCHEMAS)
    override = WRONG_TYPE[group]
    with pytest.raises(ConfigError) as e:
        compose([override])
    msg = str(e.value)
    assert override.split("=")[0] in msg and "\n" not in msg, msg


@pytest.mark.parametrize("chip", ["5801", "2801", "2803"])
def test_chip_key_accepts_bare_numbers(chip):
    cfg = compose([f"chip={chip}"])
    validate(cfg)
    assert str(cfg.chip) == chip


def test_unknown_chip_is_rejected():
    with pytest.raises(ConfigError, match="chip"):
        validate(compose(["chip=9999"]))


def test_gnetdet_448_matches_the_published_layout():
    cfg = compose(["model=gnetdet"])
    m = instantiate(cfg.model.net)
    convs = [l.conv for l in m.layers]
    assert len(convs) == 16
    assert [c.out_channels for c in convs[:-1]] == [64, 64, 128, 128] + [256] * 11
    assert convs[-1].out_channels == 10 + cfg.dataset.num_classes
    assert sum(l.pool for l in m.layers) == 5 and m.grid == 14
    assert [l.mask_bits for l in m.layers] == [3] * 13 + [8] * 3


def test_gnetdet_224_is_the_gti_mdks_224_structure():
    """Four pools after convs 1, 3, 6 and 9 (the first two convs at 224 px): a 14x14 grid, and
    every tensor the shape of GNetDet-448's (the preset says which structure a file has)."""
    m = instantiate(compose(["model=gnetdet_224"]).model.net)
    m448 = instantiate(compose(["model=gnetdet"]).model.net)
    assert [i for i, l in enumerate(m.layers) if l.pool] == [1, 3, 6, 9]
    assert [i for i, l in enumerate(m448.layers) if l.pool] == [0, 1, 3, 6, 9]
    assert m.grid == 14 and m.image_size == 224
    assert {k: v.shape for k, v in m.state_dict().items()} == \
        {k: v.shape for k, v in m448.state_dict().items()}
    assert m(torch.zeros(1, 3, 224, 224, dtype=torch.uint8)).shape == (1, 10 + 5, 14, 14)


@pytest.mark.parametrize("override,key", [
    ("trainer.batch_size=0", "trainer.batch_size"),
    ("trainer.epochs=-1", "trainer.epochs"),
    ("trainer.batch_size=abc", "trainer.batch_size"),
    ("trainer.amp=maybe", "trainer.amp"),
    ("dist.rank=3", "dist.rank"),
    ("dataset.num_classes=7", "dataset.num_classes"),
    ("trainer.batch_size=15", "trainer.batch_size"),
])
def test_bad_values_name_the_key(override, key):
    extra = ["dist.gpus=2"] if override == "trainer.batch_size=15" else []
    # A wrong type fails at compose time (typed schema, mdk/schema.py), a range in validate.
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose([override, *extra]))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=run_cmd_env(),
                          capture_output=True, text=True, timeout=120)


def test_cli_help_lists_groups_and_cfg_prints_config():
    r = _run("--help")
    assert r.returncode == 0
    for g in GROUPS:
        assert f"{g}:" in r.stdout, g
    r = _run("--cfg", "job", "trainer.batch_size=32")
    assert r.returncode == 0 and "batch_size: 32" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["trainer.nosuchkey=1"], "nosuchkey"),
    (["model=nosuchmodel"], "nosuchmodel"),
])
def test_cli_rejects_unknown_keys_and_choices(args, needle):
    r = _run(*args, "--cfg", "job")
    assert r.returncode != 0 and needle in r.stderr


def test_the_default_model_and_data_take_a_chip_input_size():
    cfg = compose([])
    assert cfg.model.image_size == 224 and cfg.dataset.generate.image_size == 224
    assert chip_takes(cfg.chip, cfg.model.image_size) and not cfg.export.allow_any_size
    assert compose(["model.image_size=448"]).dataset.generate.image_size == 448  # follows the model
    validate(compose(["pipeline=[step1,step2,cal,step3,step4]"]))


@pytest.mark.parametrize("overrides, refused", [
    (["pipeline=[step1,step2,cal,step3,step4]"], True),
    (["step=step4"], True),
    (["pipeline=[step1,step2,cal,step3,step4]", "export.allow_any_size=true"], False),
    (["pipeline=[step1,step2,cal,step3]"], False),  # nothing exports
    (["pipeline=[step1,step2,cal,step3,step4]", "+stages.step4.export=false"], False),
    (["pipeline=[step1,step2,cal,step3,step4]", "model.image_size=320"], False),
])
def test_the_input_size_is_checked_where_a_running_stage_exports(overrides, refused):
    cfg = compose(["model.image_size=192", *overrides])
    if refused:
        with pytest.raises(ConfigError, match=r"^model\.image_size=192 is no input size of chip "
                                              r"5801 \(it takes 224, 320, 448, 640 px\)"):
            validate(cfg)
    else:
        validate(cfg)


def test_a_rank_building_the_model_gets_the_same_config_error():
    """build_model (what every rank runs) turns the class's ValueError into the ConfigError the
    checks give; from a spawned rank it reaches the user as one line naming the rank."""
    cfg = compose(["model.image_size=100"])
    with pytest.raises(ConfigError) as checked:
        validate(cfg)
    with pytest.raises(ConfigError) as built:
        build_model(cfg)
    assert str(built.value) == str(checked.value) == (
        "model.image_size=100 must be divisible by 2^5 = 32 (the model has 5 2x2 max-pools): "
        "e.g. 96 or 128")

    class RankFailedError(RuntimeError):  # what launchers.processes.spawn raises, by name
        pass

    tb = f"rank 1 failed (log: r.log):\nTraceback ...\nmdk.errors.ConfigError: {built.value}\n"
    assert user_error_line(RankFailedError(tb)) == f"config error (rank 1): {built.value}"


def test_the_model_check_builds_nothing_real():
    """check_model builds GNetDet-448 on the meta device: no weights are allocated."""
    made = []
    orig = torch.nn.Conv2d.__init__

    def spy(self, *a, **k):
        orig(self, *a, **k)
        made.append(self.weight.device.type)

    torch.nn.Conv2d.__init__ = spy
    try:
        check_model(compose(["model=gnetdet"]))
    finally:
        torch.nn.Conv2d.__init__ = orig
    assert made == ["meta"] * 16
