"""Results over seeds: the aggregate table a sweep with a seed axis prints after its per-job table
(launchers/reports/sweep_stats.py) and the quantization bars judged on the means
(launchers/reports/sweep_bars.py).

Unit tests build result.json trees the way the job callback writes them (``job_record``) with known
numbers; the end-to-end test runs a real ``python run.py -m seed=0,1 pipeline=[...]``.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import TINY
from launchers.hydra_app import sweep_summary as ss
from launchers.reports import sweep_bars, sweep_results, sweep_stats
from mdk.engine.result import StageResult
from mdk.stage import stage_conf
from helpers.sweep import run_py

CHAIN = "pipeline=[step1,step2,cal,step3,step4]"


def _job(root: Path, n: int, overrides: list[str], maps: dict[str, float] | None = None,
         loss: float = 1.0, fail: str | None = None, status: str | None = None) -> None:
    """Job dir ``root/n`` with the result.json the job callback writes; ``maps``: stage -> mAP."""
    d = root / str(n)
    d.mkdir(parents=True)
    if status:  # e.g. "running": killed before on_job_end
        rec = {"status": status, "overrides": overrides}
    elif fail:
        rec = sweep_results.job_record(RuntimeError(fail), overrides, started=0.0)
    else:
        stages = [StageResult(stage=s, checkpoints=f"{d}/checkpoints/{s}", best_map50=m,
                              best_epoch=None if s == "cal" else 3 + i, final_loss=loss + i,
                              time_s=10.0 * (i + 1), bar=stage_conf(s).bar)
                  for i, (s, m) in enumerate((maps or {}).items())]
        rec = sweep_results.job_record(stages, overrides, started=0.0)
    (d / "result.json").write_text(json.dumps(rec))


def _rows(text: str, stage: str, metric: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.split()[:2] == [metric, stage]]


def _chain(step1: float, step3: float, step4: float) -> dict[str, float]:
    return {"step1": step1, "step2": step1 + 0.001, "cal": 0.5, "step3": step3, "step4": step4}


@pytest.fixture
def seeds_by_scheduler(tmp_path: Path) -> Path:
    """seed=0,1,2 x scheduler=step,cosine; cosine's seed 1 failed and seed 2 never finished."""
    step = [(0.80, 0.79, 0.780), (0.84, 0.83, 0.826), (0.88, 0.87, 0.878)]
    for s, (a, b, c) in enumerate(step):
        _job(tmp_path, 2 * s, [CHAIN, f"seed={s}", "scheduler=step"], _chain(a, b, c), loss=2.0 + s)
    _job(tmp_path, 1, [CHAIN, "seed=0", "scheduler=cosine"], _chain(0.90, 0.85, 0.86), loss=1.5)
    _job(tmp_path, 3, [CHAIN, "seed=1", "scheduler=cosine"], fail="boom")
    _job(tmp_path, 5, [CHAIN, "seed=2", "scheduler=cosine"], status="running")
    return tmp_path


def test_mean_sample_std_min_max_n_per_group_and_stage(seeds_by_scheduler):
    agg = sweep_stats.aggregate(sweep_results.collect_results(seeds_by_scheduler))
    assert agg["seeds"] == ["0", "1", "2"] and agg["group_by"] == ["scheduler"]
    step, cosine = agg["groups"]
    assert step["overrides"] == {"scheduler": "step"} and step["jobs"] == ["0", "2", "4"]
    m = step["stages"]["step1"]["best_map50"]
    assert m["n"] == 3 and m["mean"] == pytest.approx(0.84) and m["min"] == 0.80 and m["max"] == 0.88
    assert m["std"] == pytest.approx(0.04)  # sample std (n-1); the population std would be 0.0327
    assert step["stages"]["step1"]["final_loss"]["mean"] == pytest.approx(3.0)  # losses 2, 3, 4
    assert step["stages"]["step3"]["time_s"]["mean"] == 40.0  # 4th stage: 10 * 4 in every job
    assert step["stages"]["step4"]["best_epoch"]["mean"] == 7.0
    assert "best_epoch" not in step["stages"]["cal"]  # cal does not train: no best epoch
    assert list(step["stages"]) == ["step1", "step2", "cal", "step3", "step4"]
    # failed and incomplete jobs are not averaged, only counted
    assert (cosine["completed"], cosine["left_out"]) == (1, {"failed": 1, "incomplete": 1})
    c = cosine["stages"]["step1"]["best_map50"]
    assert (c["n"], c["mean"], c["std"], c["values"]) == (1, 0.90, None, [0.90])


def test_aggregate_table_rows_left_out_and_per_job_table_unchanged(seeds_by_scheduler):
    sweep = seeds_by_scheduler
    with pytest.raises(ss.SweepFailedError):  # two cosine jobs did not complete
        ss.SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    text = (sweep / "sweep_summary.txt").read_text(encoding="utf-8")
    lines = text.splitlines()
    # the per-job table comes first, as without a seed axis
    assert lines[0].split() == ["job", "seed", "scheduler", "best", "mAP@0.5", "final", "loss",
                                "time", "s", "status"]
    assert lines[1].split()[:6] == ["0", "0", "step", "0.7800", "6.0000", "150.0"]  # step4, sum of times
    assert lines[7] == f"4/6 jobs completed; sweep dir: {sweep}"
    agg_at = lines.index(next(x for x in lines if x.startswith("over seeds")))
    assert lines[agg_at - 1] == "" and agg_at > 7
    assert lines[agg_at] == ("over seeds (seed=0,1,2): n, mean ± std (std: sample, n-1), min, max of "
                             "the completed jobs per metric and stage; grouped by scheduler")
    assert lines[agg_at + 1].split() == ["metric", "stage", "scheduler", "n", "mean", "±", "std",
                                         "min", "max", "left", "out"]
    assert _rows(text, "step1", "best_map50") == [
        ["best_map50", "step1", "step", "3", "0.8400", "±", "0.0400", "0.8000", "0.8800", "0"],
        ["best_map50", "step1", "cosine", "1", "0.9000", "±", "-", "0.9000", "0.9000", "2"]]
    # metric-major: the mAP of every stage and group first, stages in pipeline order
    assert [line.split()[:3] for line in lines[agg_at + 2:agg_at + 6]] == [
        ["best_map50", "step1", "step"], ["best_map50", "step1", "cosine"],
        ["best_map50", "step2", "step"], ["best_map50", "step2", "cosine"]]
    assert lines[agg_at + 12].split()[:2] == ["best_epoch", "step1"]
    assert _rows(text, "step1", "best_epoch")[0] == ["best_epoch", "step1", "step", "3", "3.0", "±",
                                                     "0.0", "3", "3", "0"]
    assert _rows(text, "step3", "final_loss")[0][3:7] == ["3", "6.0000", "±", "1.0000"]
    assert _rows(text, "cal", "time_s")[0][3:9] == ["3", "30.0", "±", "0.0", "30.0", "30.0"]
    assert _rows(text, "cal", "best_epoch") == []
    assert "scheduler=cosine: 2 of 3 jobs left out (1 failed, 1 incomplete)" in lines
    saved = json.loads((sweep / "sweep_summary.json").read_text())
    assert saved["aggregate"]["std"] == "sample, n-1"
    assert saved["aggregate"]["groups"][0]["stages"]["step1"]["best_map50"]["values"] == [0.80, 0.84, 0.88]
    assert [s["stage"] for s in saved["jobs"][0]["stages"]] == ["step1", "step2", "cal", "step3", "step4"]
    assert "checkpoints" not in saved["jobs"][0]["stages"][0]  # numbers only in the summary


def test_bars_are_judged_on_the_means_with_their_spread(seeds_by_scheduler):
    agg = sweep_stats.aggregate(sweep_results.collect_results(seeds_by_scheduler))
    step, cosine = agg["groups"]
    b3, b4 = step["bars"]
    assert (b3["bar"], b3["met"]) == ("step3 >= step1 - 0.02 (2 points)", True)
    assert b3["stage_mean"] == pytest.approx(0.83) and b3["threshold"] == pytest.approx(0.82)
    assert b3["margin"] == pytest.approx(0.01) and b3["diff_mean"] == pytest.approx(-0.01)
    assert b3["diff_std"] == pytest.approx(0.0) and b3["met_per_seed"] == 3
    # step4 mean 0.828 vs step3 0.83 - 0.005: met on the means though seed 0 alone misses it
    # (0.780 - 0.790 = -0.010 < -0.005)
    assert (b4["bar"], b4["met"], b4["met_per_seed"]) == ("step4 >= step3 - 0.005 (0.5 points)", True, 2)
    assert b4["margin"] == pytest.approx(0.003)
    c3, c4 = cosine["bars"]  # one seed: 0.85 < 0.90 - 0.02 -> not met, no spread
    assert (c3["met"], c3["stage_std"], c3["diff_std"], c3["paired"]) == (False, None, None, 1)
    assert c4["met"] is True
    text = sweep_stats.format_aggregate(agg).splitlines()
    at = text.index("quantization bars judged on the means over seeds (best_map50):")
    assert text[at + 1:at + 4] == [
        "  scheduler=step: step3 >= step1 - 0.02 (2 points): met, margin +0.0100",
        "    means: step3 0.8300 ± 0.0400 (n=3), step1 0.8400 ± 0.0400 (n=3) -> bar 0.8200",
        "    per seed: step3 - step1 -0.0100 ± 0.0000, bar met in 3/3 seeds"]
    assert "  scheduler=cosine: step3 >= step1 - 0.02 (2 points): NOT met, margin -0.0300" in text
    assert "    means: step3 0.8500 ± - (n=1), step1 0.9000 ± - (n=1) -> bar 0.8800" in text


def test_a_bar_met_exactly_is_met_and_each_bar_needs_both_stages(tmp_path):
    # 0.87 - 0.89 in floats is -0.020000000000000018: the bar must still hold
    for s, (a, b) in enumerate([(0.89, 0.87), (0.89, 0.87)]):
        _job(tmp_path, s, [f"seed={s}", "pipeline=[step1,step2,cal,step3]"],
             {"step1": a, "step2": a, "cal": 0.5, "step3": b})
    groups = sweep_stats.aggregate(sweep_results.collect_results(tmp_path))["groups"]
    assert [(b["stage"], b["met"], b["met_per_seed"]) for b in groups[0]["bars"]] == [("step3", True, 2)]
    # the bars are the stage records' own (conf/step/step3.yaml, step4.yaml)
    assert [str(sweep_bars.Bar.from_record(s, stage_conf(s).bar)) for s in ("step3", "step4")] == [
        "step3 >= step1 - 0.02 (2 points)", "step4 >= step3 - 0.005 (0.5 points)"]


def test_seed_spellings_and_sweeps_without_a_seed_axis(tmp_path):
    for s in (0, 1):
        _job(tmp_path / "plus", s, [f"++seed={s}", "optim.lr=0.1"], {"step1": 0.5 + s / 10})
        _job(tmp_path / "none", s, ["seed=3", f"optim.lr={s}"], {"step1": 0.5})
    agg = sweep_stats.aggregate(sweep_results.collect_results(tmp_path / "plus"))
    assert agg["seeds"] == ["0", "1"] and agg["group_by"] == []
    assert agg["groups"][0]["stages"]["step1"]["best_map50"]["mean"] == pytest.approx(0.55)
    text = sweep_stats.format_aggregate(agg)
    assert text.splitlines()[0].endswith("per metric and stage")  # nothing else swept: no grouping
    assert "quantization bars" not in text  # step1 alone: no bar has both its stages
    assert sweep_stats.aggregate(sweep_results.collect_results(tmp_path / "none")) is None
    ss.SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "none")}}}))
    assert "over seeds" not in (tmp_path / "none" / "sweep_summary.txt").read_text()
    assert "aggregate" not in json.loads((tmp_path / "none" / "sweep_summary.json").read_text())


def test_a_group_whose_jobs_all_failed_and_an_unreadable_job_say_so(tmp_path):
    _job(tmp_path, 0, ["seed=0", "optim.lr=0.1"], {"step1": 0.5})
    _job(tmp_path, 1, ["seed=1", "optim.lr=0.1"], {"step1": 0.7})
    _job(tmp_path, 2, ["seed=0", "optim.lr=9"], fail="NaN loss")
    _job(tmp_path, 3, ["seed=1", "optim.lr=9"], fail="NaN loss")
    (tmp_path / "4").mkdir()
    (tmp_path / "4" / "result.json").write_text("{trunc")  # unreadable: no overrides to group by
    agg = sweep_stats.aggregate(sweep_results.collect_results(tmp_path))
    assert agg["group_by"] == ["optim.lr"] and agg["unplaced"] == ["4"]
    text = sweep_stats.format_aggregate(agg)
    assert "left out of every group: job 4 (its result.json gives no overrides)" in text
    assert _rows(text, "step1", "best_map50") == [
        ["best_map50", "step1", "0.1", "2", "0.6000", "±", "0.1414", "0.5000", "0.7000", "0"]]
    assert text.splitlines()[-2] == "optim.lr=9: 2 of 2 jobs left out (2 failed); nothing to average"


# --- end to end: python run.py -m seed=0,1 -------------------------------------------------------
@pytest.mark.slow
def test_real_seed_sweep_prints_the_means_of_its_jobs(tmp_path, shared_data):
    sweep = tmp_path / "sweep"
    res = run_py("-m", "seed=0,1", CHAIN, *TINY, "trainer.epochs=1", "trainer.limit_train_batches=2",
                 *[f"+stages.{s}.epochs=1" for s in ("step2", "step3", "step4")], "trainer.device=cpu",
                 f"paths.data={shared_data}", f"hydra.sweep.dir={sweep}")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    text = (sweep / "sweep_summary.txt").read_text(encoding="utf-8")
    assert "over seeds (seed=0,1): n, mean ± std" in text and "over seeds (seed=0,1)" in res.stdout + res.stderr
    jobs = [json.loads((sweep / j / "result.json").read_text())["stages"] for j in ("0", "1")]
    for i, stage in enumerate(("step1", "step2", "cal", "step3", "step4")):
        for metric, fmt in (("best_map50", ".4f"), ("final_loss", ".4f"), ("time_s", ".1f")):
            vals = [job[i][metric] for job in jobs]
            assert jobs[0][i]["stage"] == stage
            (row,) = _rows(text, stage, metric)
            assert row[2] == "2" and row[3] == format(statistics.fmean(vals), fmt), (stage, metric, row)
            assert row[6:8] == [format(min(vals), fmt), format(max(vals), fmt)]
    assert jobs[0][0]["final_loss"] != jobs[1][0]["final_loss"]  # the seeds did differ
    agg = json.loads((sweep / "sweep_summary.json").read_text())["aggregate"]
    loss = agg["groups"][0]["stages"]["step1"]["final_loss"]
    assert loss["mean"] == statistics.fmean([j[0]["final_loss"] for j in jobs]) and loss["n"] == 2
    assert loss["std"] == pytest.approx(abs(jobs[0][0]["final_loss"] - jobs[1][0]["final_loss"]) / 2 ** 0.5)
    assert "  step3 >= step1 - 0.02 (2 points): " in text and "  step4 >= step3 - 0.005 (0.5 points): " in text
