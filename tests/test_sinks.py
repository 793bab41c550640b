"""Sinks from conf/logger: TensorBoard events read back (stages apart on one continuing global
step, purge on resume), the null object, config errors, a new sink as YAML node + class."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import compose
from mdk.errors import ConfigError
from mdk.sinks.base import MultiSink, NullSink
from mdk.sinks.build import build_sinks
from mdk.sinks.tensorboard_sink import TensorBoardSink
from helpers.events import read_events

CONFIG = {"step": {"name": "step1"}, "seed": 0}


def scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in read_events(logdir).Scalars(tag)]


def tb_logger():
    return compose(["logger=tensorboard", "trainer.device=cpu"]).logger


def test_pipeline_stages_log_apart_on_one_continuing_step(tmp_path):
    step = 0
    for stage, n in (("step1", 6), ("step2", 4), ("step3", 5)):
        sink = build_sinks(tb_logger(), tmp_path, CONFIG, True, stage=stage, group=None)
        assert isinstance(sink, TensorBoardSink)
        for _ in range(n):
            step += 1
            sink.log({"loss/total": 10.0 * step, "lr": 0.1}, step)
        sink.log_image("val/detections", torch.full((3, 8, 8), 7, dtype=torch.uint8), step)
        sink.log_text("val/ap", "| class | AP50 |\n|---|---|\n| a | 0.5 |", step)
        sink.close()
    folders = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert folders == ["step1", "step2", "step3"]   # one TensorBoard run per stage
    steps1 = [s for s, _ in scalars(tmp_path / "tensorboard" / "step1", "loss/total")]
    assert steps1 == list(range(1, 7))
    assert scalars(tmp_path / "tensorboard" / "step2", "loss/total") == [
        (7, 70.0), (8, 80.0), (9, 90.0), (10, 100.0)]
    ea = read_events(tmp_path / "tensorboard" / "step3")
    assert [e.step for e in ea.Scalars("loss/total")] == list(range(11, 16))
    assert [e.step for e in ea.Images("val/detections")] == [15]
    assert ea.Images("val/detections")[0].width == 8
    text = ea.Tensors("val/ap/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| a | 0.5 |" in text


def test_resume_purges_the_redone_steps(tmp_path):
    sink = build_sinks(tb_logger(), tmp_path, CONFIG, True, stage="step2")
    for s in range(1, 21):
        sink.log({"loss/total": float(s)}, s)
    sink.close()  # killed after step 20; the last checkpoint was at step 12
    sink = build_sinks(tb_logger(), tmp_path, CONFIG, True, stage="step2", resume_step=12)
    for s in range(13, 26):
        sink.log({"loss/total": 100.0 + s}, s)
    sink.close()
    got = scalars(tmp_path / "tensorboard" / "step2", "loss/total")
    assert [s for s, _ in got] == list(range(1, 26))            # each step once
    assert dict(got)[12] == 12.0 and dict(got)[13] == 113.0     # kept before, redone after


def test_without_resume_step_the_redone_steps_are_duplicated(tmp_path):
    """The control: what purge_step prevents."""
    for start in (1, 13):
        sink = build_sinks(tb_logger(), tmp_path, CONFIG, True, stage="step2")
        for s in range(start, 21):
            sink.log({"loss/total": float(s)}, s)
        sink.close()
    assert len(scalars(tmp_path / "tensorboard" / "step2", "loss/total")) == 20 + 8


def test_off_or_not_rank0_is_a_null_sink_writing_nothing(tmp_path):
    assert type(build_sinks(tb_logger(), tmp_path, CONFIG, False, stage="step1")) is NullSink
    off = compose(["logger=none", "trainer.device=cpu"]).logger
    sink = build_sinks(off, tmp_path, CONFIG, True, stage="step1")
    assert type(sink) is NullSink
    sink.log({"a": 1.0}, 1), sink.log_image("x", torch.zeros(3, 2, 2, dtype=torch.uint8), 1)
    sink.log_text("t", "x", 1), sink.close()
    cfg = compose(["logger=tensorboard", "logger.sinks.tensorboard=null", "trainer.device=cpu"])
    assert type(build_sinks(cfg.logger, tmp_path, CONFIG, True, stage="step1")) is NullSink
    assert list(tmp_path.iterdir()) == []


def test_stage_defaults_to_the_config_step(tmp_path):
    sink = build_sinks(tb_logger(), tmp_path, {"step": {"name": "cal"}}, True)
    sink.log({"a": 1.0}, 3)
    sink.close()
    assert scalars(tmp_path / "tensorboard" / "cal", "a") == [(3, 1.0)]


class RecordingSink(NullSink):
    """A sink added by config alone: ``_target_`` names this class."""
    made: list["RecordingSink"] = []

    def __init__(self, *, run_dir, stage, group, resume_step, config, prefix="rec"):
        self.args = (Path(run_dir), stage, group, resume_step, config["seed"], prefix)
        self.calls: list[tuple] = []
        RecordingSink.made.append(self)

    def log(self, scalars, step):
        self.calls.append(("log", dict(scalars), step))

    def log_image(self, tag, image, step):
        self.calls.append(("image", tag, tuple(image.shape), step))


def test_a_new_sink_is_a_yaml_node_and_a_class(tmp_path):
    RecordingSink.made.clear()
    cfg = compose(["logger=tensorboard", "trainer.device=cpu",
                   "+logger.sinks.rec={_target_:test_sinks.RecordingSink,prefix:p}"])
    sink = build_sinks(cfg.logger, tmp_path, CONFIG, True, stage="step3", group="sw",
                       resume_step=40)
    assert isinstance(sink, MultiSink) and len(sink.sinks) == 2
    sink.log({"loss/total": 2.0}, 41)
    sink.log_image("g", torch.zeros(3, 4, 5, dtype=torch.uint8), 41)
    sink.close()
    rec = RecordingSink.made[0]
    assert rec.args == (tmp_path, "step3", "sw", 40, 0, "p")
    assert rec.calls == [("log", {"loss/total": 2.0}, 41), ("image", "g", (3, 4, 5), 41)]
    assert scalars(tmp_path / "tensorboard" / "step3", "loss/total") == [(41, 2.0)]


@pytest.mark.parametrize("override,match", [
    ("+logger.sinks.bad={_target_:mdk.sinks.NoSuchSink}", r"logger\.sinks\.bad\._target_="),
    ("+logger.sinks.bad={project:x}", r"logger\.sinks\.bad=.*needs a _target_"),
    ("+logger.sinks.tensorboard.colour=red", r"logger\.sinks\.tensorboard: .*colour"),
])
def test_config_errors_name_the_sink(tmp_path, override, match):
    cfg = compose(["logger=tensorboard", "trainer.device=cpu", override])
    with pytest.raises(ConfigError, match=match):
        build_sinks(cfg.logger, tmp_path, CONFIG, True, stage="step1")


def test_log_image_wants_uint8_chw(tmp_path):
    sink = build_sinks(tb_logger(), tmp_path, CONFIG, True, stage="step1")
    with pytest.raises(ValueError, match="uint8 \\[3, H, W\\]"):
        sink.log_image("g", torch.zeros(4, 4, 3, dtype=torch.uint8), 1)
    sink.close()


# The writer thread's own exception is not printed either (pytest reports one as this warning).
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_sink_that_cannot_write_warns_once_and_the_run_goes_on(tmp_path, monkeypatch, caplog,
                                                                 capfd):
    """TensorBoard's writer thread meets a full disk: the next call in the training thread gets
    its OSError; the sink warns once, naming itself, its folder and why, then writes nothing
    more and closes quietly (before: the error stopped the run with an ~80-line traceback)."""
    import errno

    sink = build_sinks(tb_logger(), tmp_path, CONFIG, True, stage="step1")
    sink.log({"loss/total": 1.0}, 1)
    full = OSError(errno.ENOSPC, "No space left on device")

    def fail(*a, **k):
        raise full

    # The event file's own writer: the failure starts in TensorBoard's thread, as on a full disk.
    for writer in sink.w.all_writers.values():
        monkeypatch.setattr(writer.event_writer._general_file_writer, "write", fail)
    for step in range(2, 6):
        sink.log({"loss/total": float(step)}, step)
        sink.log_text("val/ap", "x", step)
    sink.close()
    warned = [r.getMessage() for r in caplog.records if "stopped writing" in r.getMessage()]
    assert warned == [f"TensorBoardSink stopped writing to {tmp_path / 'tensorboard' / 'step1'}: "
                      "the disk is full ([Errno 28] No space left on device); the run goes on "
                      "without it"]
    assert sink.broken
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err  # the thread's too


def test_a_sink_that_cannot_start_is_left_out_with_a_warning(tmp_path, caplog):
    (tmp_path / "tensorboard").write_text("a file where the sink's folder goes")
    sink = build_sinks(tb_logger(), tmp_path, CONFIG, True, stage="step1")
    assert type(sink) is NullSink
    assert "logger.sinks.tensorboard could not start" in caplog.text
    assert "the run goes on without it" in caplog.text


def test_a_bug_in_a_sink_is_not_hidden(tmp_path):
    sink = build_sinks(tb_logger(), tmp_path, CONFIG, True, stage="step1")
    with pytest.raises(ValueError, match="expected a uint8"):
        sink.log_image("val/x", torch.zeros(3, 4, 4), 1)  # float: the caller's bug
    sink.close()
