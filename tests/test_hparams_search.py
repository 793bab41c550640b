"""Hyperparameter search: `python run.py -m hparams_search=<name>` (an Optuna study through mdk's
sweeper, hydra/sweeper=mdk_optuna), the objective a run returns (launchers/hydra_app/objective.py),
the search space, a trial's reporter and the table.

The real studies run on the tiny model: a 6-trial study with the median pruner here; a study killed
and resumed and parallel trials in test_search_resume.py; SLURM in test_slurm_jobs.py.
"""
from __future__ import annotations

import json
import pickle
import subprocess
import types

import optuna
import pytest
import torch
from omegaconf import OmegaConf

from conftest import REPO, TINY, compose, run_cmd_env
from launchers.hydra_app.objective import FailedRun, StageResults, with_objective
from launchers.hydra_app.optuna_space import search_space
from launchers.hydra_app.optuna_study import fail_stale_trials, open_storage, storage_url
from launchers.hydra_app.optuna_trial import TrialReporter
from launchers.reports.sweep_results import format_table
from mdk.engine.result import StageResult
from mdk.errors import ConfigError
from helpers.search import _search

optuna.logging.set_verbosity(optuna.logging.WARNING)

PIPELINE = [StageResult("step1", best_map50=0.5, final_loss=2.0),
            StageResult("step2", best_map50=0.375, final_loss=1.75),
            StageResult("cal", best_map50=0.25, final_loss=None),
            StageResult("step3", best_map50=0.4375, final_loss=1.5),
            StageResult("step4", final_loss=None)]
STAGES = ["step1", "step2", "cal", "step3", "step4"]


def test_objective_is_the_metric_of_the_chosen_stage():
    assert float(StageResults(PIPELINE, STAGES, "best_map50")) == 0.4375  # last with a metric: step3
    assert float(StageResults(PIPELINE, STAGES, "best_map50", "step1")) == 0.5
    assert float(StageResults(PIPELINE, STAGES, "final_loss", "step2")) == 1.75
    res = StageResults(PIPELINE, STAGES, "final_loss")
    assert list(res) == PIPELINE and float(res) == 1.5  # still the list the sweep table reads
    back = pickle.loads(pickle.dumps(res))  # submitit pickles the job's return value
    assert list(back) == PIPELINE and float(back) == 1.5
    two = StageResults(PIPELINE, STAGES, ["best_map50", "final_loss"], "step2")  # two objectives
    assert two.objectives() == [0.375, 1.75] and two.stop_reason is None
    with pytest.raises(TypeError, match="several values"):
        float(two)
    cut = [StageResult("step1", final_loss=3.0, extra={"stop_reason": "pruned by study s", "stopped_epoch": 2})]
    assert StageResults(cut, ["step1"], "final_loss").stop_reason == "pruned by study s"


def test_objective_refuses_what_would_break_the_study():
    with pytest.raises(ValueError, match="objective.stage=step3 did not run"):
        float(StageResults(PIPELINE[:1], ["step1"], "best_map50", "step3"))
    with pytest.raises(ValueError, match="objective.metric=best_map50: no value in the results of stage step4"):
        float(StageResults(PIPELINE, STAGES, "best_map50", "step4"))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"final_loss of step1 is {bad}"):
            float(StageResults([StageResult("step1", final_loss=bad)], ["step1"], "final_loss"))
    failed = FailedRun({"status": "failed", "error": "config error: optim.lr=-1.0 must be a number > 0\nmore"})
    with pytest.raises(TypeError):
        float(failed)
    assert str(failed) == "run failed: config error: optim.lr=-1.0 must be a number > 0"


def test_with_objective_wraps_results_and_failures():
    cfg = compose([*TINY, "trainer.device=cpu", "pipeline=[step1,step2]", "objective.stage=step1"])
    res = with_objective(cfg, PIPELINE[:2])
    assert isinstance(res, StageResults) and float(res) == 0.5
    failed = with_objective(cfg, {"status": "failed", "error": "boom"})
    assert isinstance(failed, FailedRun) and failed["error"] == "boom"
    no_search = OmegaConf.create({"pipeline": [], "step": {"name": "step1"}})  # no `objective`
    assert type(with_objective(no_search, PIPELINE[:1])) is list


def test_search_space_speaks_the_override_grammar():
    space = search_space({"optim.lr": "tag(log, interval(0.0003, 0.01))", "scheduler": "choice(cosine, step)",
                          "+stages.step3.epochs": "range(4, 13, 4)", "trainer.epochs": 3},
                         ["optim.weight_decay=interval(0, 1)", "trainer.batch_size=tag(int, interval(4, 16))", "pipeline=choice([step1],[step1,step2])",
                          "scheduler=cosine,multistep"])  # the command line wins over params
    d = space.distributions
    assert d["optim.lr"] == optuna.distributions.FloatDistribution(0.0003, 0.01, log=True)
    assert d["stages.step3.epochs"] == optuna.distributions.IntDistribution(4, 12, step=4)
    assert d["optim.weight_decay"] == optuna.distributions.FloatDistribution(0.0, 1.0)
    assert d["trainer.batch_size"] == optuna.distributions.IntDistribution(4, 16)
    assert d["scheduler"].choices == ("cosine", "multistep")
    assert space.fixed == ["trainer.epochs=3"]
    assert space.overrides({"optim.lr": 0.001, "stages.step3.epochs": 8, "pipeline": "[step1,step2]",
                            "scheduler": "multistep"}) == [
        "trainer.epochs=3", "optim.lr=0.001", "+stages.step3.epochs=8", "pipeline=[step1,step2]",
        "scheduler=multistep"]
    assert search_space(None, ["x=choice('a b','true')"]).overrides({"x": "true"}) == ["x='true'"]
    for bad, match in [("interval(1, 0)", "low end below"), ("tag(log, interval(0, 1.5))", "low end > 0"),
                       ("tag(log, choice(1, 2))", "needs an interval"), ("range(5, 1)", "is empty"),
                       ("interval(0.1,", r"could not parse 'interval\(0.1,' \(.+\); write a range as "
                                         r"choice\(a,b\), a,b, range\(1,10,2\), interval")]:
        with pytest.raises(ConfigError, match=rf"hydra.sweeper.params.k: .*{match}"):
            search_space({"k": bad}, [])


def _trainer(epoch: int, epochs: int):
    return types.SimpleNamespace(epoch=epoch - 1, epochs=epochs, stop=False, stop_reason=None)


def test_reporter_reports_each_epoch_and_stops_the_trial_its_pruner_prunes(tmp_path):
    url = storage_url(None, tmp_path)
    study = optuna.create_study(study_name="s", storage=open_storage(url), direction="minimize")
    for losses in ([1.0, 0.5, 0.25], [1.2, 0.6, 0.3]):  # two finished trials set the median
        t = study.ask()
        for step, v in enumerate(losses, 1):
            t.report(v, step)
        study.tell(t, losses[-1])
    number = study.ask().number
    loss = {"final_loss": 0.9}
    pruner = {"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 2}
    hook = TrialReporter(stage="step1", run_dir=tmp_path, is_main=True, so_far=lambda: loss,
                         study="s", storage=url, trial=number, metric="final_loss", pruner=pruner)
    hook.before_train()
    hook.trainer = _trainer(1, 3)
    hook.after_epoch()  # 0.9 is better than the median 1.1 at epoch 1: goes on
    assert not hook.trainer.stop
    loss["final_loss"] = 0.8
    hook.trainer = _trainer(2, 3)
    hook.after_epoch()  # 0.8 is worse than 0.55 at epoch 2: pruned
    assert hook.trainer.stop and hook.trainer.stop_reason.startswith("pruned by study s (trial 2) at epoch 2")
    trial = study.trials[number]
    assert trial.intermediate_values == {1: 0.9, 2: 0.8} and trial.state.name == "RUNNING"
    study.tell(number, state=optuna.trial.TrialState.FAIL)  # e.g. a new sweep failed it
    hook.trainer = _trainer(3, 4)
    hook.after_epoch()
    assert hook.trainer.stop and "no longer running" in hook.trainer.stop_reason


def test_stale_running_trials_fail_and_run_again_once(tmp_path):
    study = optuna.create_study(study_name="s", storage=open_storage(storage_url(None, tmp_path)))
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    done = study.ask(dist)
    study.tell(done, 0.5)
    left = study.ask(dist)  # RUNNING when the sweep was killed
    notes = fail_stale_trials(study)
    assert list(notes) == [left.number] and "runs again" in notes[left.number]
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "WAITING"]
    retry = study.ask(dist)  # the sweep asks the queued trial first: same parameters
    assert retry.params == left.params and retry.user_attrs == {"retry_of": left.number}
    assert "it was a retry already" in fail_stale_trials(study)[retry.number]  # killed again
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "FAIL"]


def test_table_shows_each_trials_state_value_and_epoch(tmp_path):
    rows = [{"job": "0", "status": "completed", "overrides": ["optim.lr=0.005"], "final_loss": 3.5,
             "time_s": 2.0, "trial": {"number": 0, "state": "COMPLETE", "values": [3.5], "epoch": 3}},
            {"job": "1", "status": "pruned", "overrides": ["optim.lr=1e-06"], "final_loss": 5.4,
             "stopped_epoch": 1, "trial": {"number": 1, "state": "PRUNED", "values": [5.4], "epoch": 1}},
            {"job": "2", "status": "incomplete", "overrides": ["optim.lr=0.004"],
             "trial": {"number": 2, "state": "FAIL", "values": None, "epoch": None,
                       "note": "the sweep stopped while this trial ran"}}]
    lines = format_table(rows, tmp_path).splitlines()
    assert lines[0].split() == ["job", "optim.lr", "best", "mAP@0.5", "final", "loss", "value", "epoch",
                                "time", "s", "status"]
    assert lines[1].split()[-6:] == ["3.5", "3", "2.0", "COMPLETE", "(trial", "0)"]
    assert lines[2].split()[-6:] == ["5.4", "1", "-", "PRUNED", "(trial", "1)"]
    assert "FAIL (trial 2): the sweep stopped while this trial ran" in lines[3]
    assert lines[4].startswith("1 COMPLETE, 1 FAIL, 1 PRUNED of 3 trials")


def test_shipped_search_config_composes_an_optuna_study():
    from hydra import compose as hcompose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hcompose("config", overrides=["hparams_search=lr_warmup", "hydra/sweeper/pruner=median"],
                       return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.mdk_optuna.OptunaSweeper" and sweeper.direction == "maximize"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == 0
    assert sweeper.pruner._target_ == "optuna.pruners.MedianPruner" and sweeper.storage is None
    assert set(sweeper.params) == {"optim.lr", "scheduler.warmup.iters", "scheduler"}
    assert sweeper.max_failure_rate == 1.0 and cfg.hydra.callbacks.sweep.fail_on_error is False
    assert cfg.objective.metric == "best_map50" and cfg.objective.stage is None
    assert cfg.trainer.hooks == {}  # a trial's reporter is added in the trial's run only


def enqueue(sweep, lrs: list[float]) -> None:
    """Create study ``t`` in the sweep dir's journal with these trials first (the sweeper continues it)."""
    study = optuna.create_study(study_name="t", storage=open_storage(storage_url(None, sweep)),
                                direction="minimize")
    for lr in lrs:
        study.enqueue_trial({"optim.lr": lr})


def test_median_pruner_stops_a_poor_trial_early_and_a_failed_trial_is_recorded(tmp_path, shared_data):
    """Six trials of 3 epochs: a good lr twice (the median), a bad config (FAIL), a tiny lr whose
    loss at epoch 1 is worse than the median (PRUNED: it stops after epoch 1, its last.pth holds
    epoch 1), the good lr again (as good as the median: not pruned), the tiny lr again."""
    sweep = tmp_path / "sweep"
    enqueue(sweep, [0.005, 0.005, -1.0, 1e-6, 0.005, 1e-6])
    res = subprocess.run(_search(sweep, "optim.lr=choice(0.005,-1.0,0.000001)", "trainer.epochs=3",
                                 "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=2",
                                 "hydra.sweeper.n_trials=6", f"paths.data={shared_data}"),
                         env=run_cmd_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    study = optuna.load_study(study_name="t", storage=open_storage(storage_url(None, sweep)))
    states = [(t.params["optim.lr"], t.state.name) for t in study.trials]
    assert states == [(0.005, "COMPLETE"), (0.005, "COMPLETE"), (-1.0, "FAIL"), (1e-6, "PRUNED"),
                      (0.005, "COMPLETE"), (1e-6, "PRUNED")]
    jobs = {j["job"]: j for j in json.loads((sweep / "sweep_summary.json").read_text())["jobs"]}
    assert jobs["2"]["status"] == "failed" and "config error: optim.lr=-1.0 must be a number > 0" in jobs["2"]["error"]
    for n in ("3", "5"):  # pruned after epoch 1 of 3: the log, the result and last.pth say so
        assert study.trials[int(n)].intermediate_values.keys() == {1}
        assert jobs[n]["status"] == "pruned" and jobs[n]["stopped_epoch"] == 1
        assert jobs[n]["trial"] == {"number": int(n), "state": "PRUNED",
                                    "values": [study.trials[int(n)].value], "epoch": 1}
        log = (sweep / n / "run.log").read_text()
        assert f"pruned by study t (trial {n}) at epoch 1" in log and "stops after epoch 1/3" in log
        last = torch.load(sweep / n / "checkpoints" / "step1" / "last.pth", weights_only=False)
        assert last["trainer"] == {"epoch": 0, "iter": 2} and last["epoch_done"]  # 1 epoch of 2 steps
    for n in ("0", "1", "4"):
        assert study.trials[int(n)].intermediate_values.keys() == {1, 2, 3}
        assert study.trials[int(n)].value == jobs[n]["final_loss"]  # trial n is job n
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_value == study.best_value == min(jobs[n]["final_loss"] for n in ("0", "1", "4"))
    table = (sweep / "sweep_summary.txt").read_text()
    assert "PRUNED (trial 3)" in table and "3 COMPLETE, 1 FAIL, 2 PRUNED of 6 trials" in table
