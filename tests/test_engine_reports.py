"""When a stage's reports are written (mdk/engine/reports.py): per-class AP to the sinks after
every evaluation; the pictures (detection grid, PR curves) of the best evaluation once, at the
end of the stage."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

from mdk.engine.reports import EvalReporter, ReportHook
from mdk.engine.runner import run_stage
from mdk.eval.grid import dataset_grid
from mdk.eval.plots import pr_curve_images
from helpers.reports import _result, read_png

NAMES = [f"c{i}" for i in range(13)]


class Data:
    class_names = NAMES

    def image(self, i):
        return torch.full((3, 32, 32), 10 * i, dtype=torch.uint8)

    def gt(self, i):
        return torch.tensor([[4.0, 4, 20, 20]]), torch.tensor([0]), torch.tensor([False])


class Recorder:
    def __init__(self):
        self.calls = []

    def log(self, scalars, step):
        self.calls.append(("log", step))

    def log_text(self, tag, text, step):
        self.calls.append(("text", tag, step))

    def log_image(self, tag, image, step):
        self.calls.append(("image", tag, step, image))


def _dets(score):
    return {i: {"boxes": torch.tensor([[4.0, 4, 20, 20]]), "scores": torch.tensor([score]),
                "labels": torch.tensor([0])} for i in (1, 2, 3)}


def test_sinks_every_evaluation_pictures_of_the_best_once(tmp_path):
    sink = Recorder()
    rep = EvalReporter(tmp_path, "step1", Data(), sink, grid_images=3)
    evals = [(_result(seed=1), _dets(0.5), True), (_result(seed=2), _dets(0.9), True),
             (_result(seed=3), _dets(0.2), False)]
    for step, (result, dets, best) in enumerate(evals, start=1):
        rep.keep[:] = [result, dets]
        rep.after_eval(10 * step, best=best)
    assert [c[:2] for c in sink.calls] == [("log", 10), ("text", "val/ap_table"), ("log", 20),
                                           ("text", "val/ap_table"), ("log", 30),
                                           ("text", "val/ap_table")]
    assert list(tmp_path.iterdir()) == []  # no picture during training

    paths = rep.write_best(31)
    assert sorted(p.name for p in paths) == ["detections_step1.png", "pr_step1_1.png",
                                             "pr_step1_2.png"]
    # The second evaluation's pictures (the best), not the last one's.
    grid = dataset_grid(Data(), _dets(0.9), NAMES, count=3)
    (_, tag, step, logged), = [c for c in sink.calls if c[0] == "image"]
    assert (tag, step) == ("val/best_detections", 31) and torch.equal(logged, grid)
    assert torch.equal(read_png(tmp_path / "detections_step1.png"), grid)
    title = "step1 best (VOC07 11-point mAP@0.5)"
    assert torch.equal(read_png(tmp_path / "pr_step1_1.png"),
                       pr_curve_images(_result(seed=2), NAMES, title=title)[0])
    assert rep.write_best(32) == []  # drawn once


def test_a_stage_resumed_after_its_best_says_where_the_pictures_are(tmp_path, caplog):
    rep = EvalReporter(tmp_path, "step1", Data(), Recorder())
    hook = ReportHook(rep, SimpleNamespace(best_epoch=2), 0, tmp_path / "ck/step1/best.pth")
    hook.trainer = SimpleNamespace(iter=40, epoch=5, metrics={})
    with caplog.at_level(logging.INFO, logger="mdk.engine.reports"):
        hook.after_train()
    assert list(tmp_path.iterdir()) == []
    assert (f"the best evaluation of step1 (epoch 3) came before this run resumed" in caplog.text
            and f"python -m mdk.tools.evaluate {tmp_path}/ck/step1/best.pth --reports <dir>"
            in caplog.text)


def test_a_stage_draws_its_best_evaluation_once_at_its_end(tiny_cfg, tmp_path, caplog):
    cfg = tiny_cfg("trainer.limit_train_batches=2", "trainer.epochs=3")
    with caplog.at_level(logging.INFO):
        out = run_stage(cfg, tmp_path / "run")
    msgs = [r.getMessage() for r in caplog.records]
    pictures = [i for i, m in enumerate(msgs) if m.startswith(("precision-recall curves",
                                                                "detections of the best"))]
    evals = [i for i, m in enumerate(msgs) if "val mAP@0.5" in m]
    assert len(evals) == 3 and len(pictures) == 2 and min(pictures) > max(evals)
    assert (tmp_path / "run" / "detections_step1.png").is_file()
    assert (tmp_path / "run" / "pr_step1_1.png").is_file() and out.best_epoch is not None
