"""One way from a weights file to a model (mdk/checkpoint/weights_file.py): every tool (evaluate,
demo, to_gti, ckpt_diff, the quantization report) and a stage's start, given the same file (a
GTI MDK checkpoint, an mdk stage checkpoint, a torchvision VGG-16 file, a pickle that would run
code), say the same of it: what it is and holds, the same tensors where they load it, the same
one-line refusal where they cannot use it. At 224 px on the GTI MDK's 224 structure, whose files
the GTI MDK and to_gti both read."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models.vgg import cfgs, make_layers

from conftest import compose
from helpers.gti_layout import GTI_224, gti_features, save_gti
from mdk.checkpoint import weights_file
from mdk.checkpoint.files import atomic_save
from mdk.checkpoint.layout import StageCheckpointer
from mdk.checkpoint.weights_file import load_start, read_weights
from mdk.errors import CheckpointError
from mdk.insight.stages import Present, load_row
from mdk.models.build import build_model
from mdk.stage import config_for_stage
from mdk.stage_config import StageConf
from mdk.tools import ckpt_diff, demo, evaluate, to_gti

C = 3
OVERRIDES = ["model=gnetdet_224", "model.net.batch_norm=false", "dataset.class_names=[a,b,c]",
             f"dataset.num_classes={C}", "trainer.device=cpu"]
NOT_A_STAGE = "not a checkpoint of an mdk stage"
CODE = "was refused: it would call or build posix.mkdir"


class _Payload:
    """Unpickling it calls ``os.mkdir(marker)``: a stand-in for any code a pickle can run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The four files, each as ``<root>/<kind>/step1/best.pth`` (where the report looks)."""
    root = tmp_path_factory.mktemp("weights")
    cfg = compose([*OVERRIDES, f"paths.checkpoints={root}/mdk"])
    out = {}
    sc = config_for_stage(cfg, "step1")
    torch.manual_seed(0)
    out["mdk"] = root / "mdk" / "step1" / "best.pth"
    atomic_save(StageCheckpointer(sc, StageConf.from_node(sc.step)).contents(build_model(cfg)),
                out["mdk"])
    gti = save_gti(gti_features(GTI_224, 10 + C, False, seed=3), root / "gti_root", 1)
    out["gti"] = root / "gti" / "step1" / "best.pth"
    out["gti"].parent.mkdir(parents=True)
    gti.rename(out["gti"])
    # VGG-16's convs under torchvision's names and its last classifier layer (the whole
    # classifier is 120M parameters; the file's kind and fit are the same)
    torch.manual_seed(0)
    state = {f"features.{k}": v for k, v in make_layers(cfgs["D"]).state_dict().items()}
    state.update({f"classifier.6.{k}": v for k, v in torch.nn.Linear(64, 10).state_dict().items()})
    out["vgg"] = root / "vgg" / "step1" / "best.pth"
    out["vgg"].parent.mkdir(parents=True)
    torch.save(state, out["vgg"])
    out["code"] = root / "code" / "step1" / "best.pth"
    out["code"].parent.mkdir(parents=True)
    torch.save({"model": {"layers.0.conv.weight": torch.zeros(8, 3, 3, 3)},
                "extra": _Payload(str(root / "code-ran"))}, out["code"])
    image = root / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (224, 224, 3), np.uint8)).save(image)
    return {**out, "root": root, "image": image, "grid": int(build_model(cfg).grid)}


def _answers(files, kind: str, capsys) -> dict[str, str]:
    """What each tool says of the file of ``kind``: its first line, or its one error line."""
    path, root, said = files[kind], files["root"], {}
    try:  # evaluate.main's model (its evaluation then needs a dataset)
        said["evaluate"] = evaluate.load_any(path, OVERRIDES).description
    except evaluate.ToolError as e:
        said["evaluate"] = f"error: {e}"
    assert demo.main([str(path), *OVERRIDES, "--image", str(files["image"]), "--out",
                      str(root / f"{kind}.png")]) in (0, 1)
    said["demo"] = _first(capsys)
    assert to_gti.main([str(path), str(root / f"to_gti_{kind}")]) in (0, 1)
    said["to_gti"] = _first(capsys)
    try:
        ckpt_diff.main([str(path), str(path)])
        said["ckpt_diff"] = _first(capsys)
    except SystemExit as e:
        said["ckpt_diff"] = str(e)
    cfg = compose([*OVERRIDES, f"paths.checkpoints={root / kind}"])
    try:
        load_row(cfg, Present("step1", path, "float"), files["grid"])
        said["report"] = f"{path} loaded"
    except CheckpointError as e:
        said["report"] = str(e)
    return said


def _first(capsys) -> str:
    out = capsys.readouterr()
    return (out.err.strip() or out.out.strip()).splitlines()[0]


def test_every_tool_says_the_same_of_each_kind_of_file(files, capsys):
    mdk, gti, vgg = (read_weights(files[k]) for k in ("mdk", "gti", "vgg"))
    assert (mdk.kind, gti.kind, vgg.kind) == ("mdk", "gti", "vgg")
    assert mdk.describe() == "an mdk checkpoint of stage step1 (3 classes, 2 boxes per cell)"
    assert gti.describe() == "a GTI MDK checkpoint (16 conv layers, 3 classes)"
    assert vgg.describe() == "a torchvision VGG file (13 conv layers)"

    # an mdk stage checkpoint: every tool takes it and names it alike
    said = _answers(files, "mdk", capsys)
    head = f"{files['mdk']} is {mdk.describe()}"
    assert said["evaluate"] == said["demo"] == f"{head}, evaluated as step1"
    assert said["to_gti"] == head
    assert said["ckpt_diff"] == head
    assert said["report"] == f"{files['mdk']} loaded"

    # a GTI MDK checkpoint: the evaluating tools read it in its GTI step's mode; the tools that
    # need a stage checkpoint refuse it in the same words
    said = _answers(files, "gti", capsys)
    head = f"{files['gti']} is {gti.describe()}"
    assert said["demo"] == said["evaluate"]
    assert said["demo"].startswith(f"{head}, read as model=gnetdet_224: GTI step 1, float")
    for tool in ("to_gti", "ckpt_diff", "report"):
        assert f"{head}, {NOT_A_STAGE}; " in said[tool], (tool, said[tool])

    # a VGG file and a pickle that would run code: refused by every tool in the same words
    said = _answers(files, "vgg", capsys)
    for tool, line in said.items():
        assert f"{files['vgg']} is {vgg.describe()}, {NOT_A_STAGE}; " in line, (tool, line)
    said = _answers(files, "code", capsys)
    for tool, line in said.items():
        assert f"checkpoint {files['code']} {CODE}" in line, (tool, line)
    assert not (files["root"] / "code-ran").exists()


def test_the_tools_and_a_stage_load_the_same_tensors(files, tmp_path):
    cfg = compose([*OVERRIDES, f"paths.checkpoints={files['root'] / 'mdk'}"])
    by_tool = evaluate.load_any(files["mdk"], OVERRIDES).model.state_dict()
    by_report = load_row(cfg, Present("step1", files["mdk"], "float"), files["grid"]).state_dict()
    saved = read_weights(files["mdk"]).content["model"]
    assert by_tool.keys() == by_report.keys() == saved.keys()
    assert all(torch.equal(by_tool[k], saved[k]) and torch.equal(by_report[k], saved[k])
               for k in saved)
    # a GTI float file: evaluate's model (GTI step 1's mode) is step1's start from it
    evaluated = evaluate.load_any(files["gti"], OVERRIDES).model.state_dict()
    spec = StageConf.from_node(config_for_stage(cfg, "step1").step)
    started = build_model(cfg)
    said = load_start(started, read_weights(files["gti"]), cfg, spec)
    assert said.startswith("32 of 32 tensors copied")
    assert all(torch.equal(v, evaluated[k]) for k, v in started.state_dict().items())


def test_evaluate_composes_reads_and_builds_once(files, monkeypatch):
    calls = {"compose": 0, "read": 0, "build": 0}

    def counting(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(evaluate, "compose", counting("compose", evaluate.compose))
    monkeypatch.setattr(weights_file, "read_pth", counting("read", weights_file.read_pth))
    monkeypatch.setattr(weights_file, "build_model", counting("build", weights_file.build_model))
    for kind in ("mdk", "gti"):
        calls.update(compose=0, read=0, build=0)
        evaluate.load_any(files[kind], OVERRIDES)
        assert calls == {"compose": 1, "read": 1, "build": 1}, kind
