"""The sweeper in this process with a stand-in launcher: a study of two objectives keeps its Pareto
front; and what a search says when something is wrong (docs/errors.md, the search entries): config
errors of the study are one line before any trial; a trial whose job returned no result is FAIL and
the study goes on; too many failures end it; a stop signal ends it with the line saying how to go on.

All in this process with a stand-in launcher: sub-second (the real studies: test_hparams_search.py,
test_search_resume.py).
"""
from __future__ import annotations

import json

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from launchers.hydra_app.job_ends import JobsEndedError
from launchers.hydra_app.objective import StageResults
from launchers.hydra_app.optuna_space import search_space
from launchers.hydra_app.optuna_study import (claim_sweep_dir, directions, group_node, make_pruner, open_storage, storage_url,
                                              write_best)
from launchers.hydra_app.optuna_sweeper import SearchConfigError, SearchFailedError, SearchSweeper
from mdk.engine.result import StageResult
from mdk.errors import ConfigError
from mdk.stop import StopRequested

optuna.logging.set_verbosity(optuna.logging.WARNING)

STOPPED = ("sweep job {n} (77): stopped by SIGTERM in step1 at epoch 1 iteration 2; rerun the same "
           "command to continue the study (a trial that was running runs again as a new trial)")


class Launcher:
    """Stands in for a submitit launcher: each job ends as ``outcome(num)`` says (a JobReturn, or
    what it raises)."""

    def __init__(self, outcome):
        self.outcome, self.launched = outcome, []

    def launch(self, job_overrides, initial_job_idx):
        self.launched.append(initial_job_idx)
        return [self.outcome(initial_job_idx)]


def _sweeper(tmp_path, launcher=None, **kw) -> SearchSweeper:
    s = SearchSweeper(**kw)
    s.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}, "job": {"name": "run"}}})
    s.launcher = launcher or Launcher(lambda num: None)
    s._job_dir = lambda study, trial, overrides: str(tmp_path / "sweep" / str(trial.number))
    return s


def _space():
    return type("Space", (), {"distributions": {"lr": optuna.distributions.CategoricalDistribution([1, 2, 3])},
                              "overrides": lambda self, p: [f"lr={p['lr']}"]})()


def test_a_study_of_two_objectives_tells_both_values_and_keeps_the_pareto_front(tmp_path):
    """direction [maximize, minimize] with objective.metric [best_map50, final_loss]: trial lr=1
    (mAP 0.5, loss 2) and lr=3 (0.7, 3) are both on the front, lr=2 (0.4, 2.5) is dominated."""
    runs = {1: (0.5, 2.0), 2: (0.4, 2.5), 3: (0.7, 3.0)}

    def job(num):
        ret = JobReturn()
        ret.status = JobStatus.COMPLETED
        lr = study.trials[num].params["lr"]
        ret.return_value = StageResults([StageResult("step1", best_map50=runs[lr][0], final_loss=runs[lr][1])],
                                        ["step1"], ["best_map50", "final_loss"])
        return ret

    s = _sweeper(tmp_path, Launcher(job), direction=["maximize", "minimize"], n_trials=3)
    study = optuna.create_study(study_name="s", storage=open_storage(storage_url(None, tmp_path / "sweep")),
                                directions=["maximize", "minimize"])
    for lr in (1, 2, 3):
        study.enqueue_trial({"lr": lr})
    s._run_trials(study, _space(), [])
    assert [t.values for t in study.trials] == [[0.5, 2.0], [0.4, 2.5], [0.7, 3.0]]
    write_best(study, tmp_path / "best.yaml", ["maximize", "minimize"])
    best = OmegaConf.load(tmp_path / "best.yaml")
    assert best.directions == ["maximize", "minimize"]
    assert sorted((x["trial"], list(x["values"])) for x in best.solutions) == [(0, [0.5, 2.0]), (2, [0.7, 3.0])]


def test_the_studys_own_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"hydra.sweeper.direction='up' must be maximize, minimize or a list"):
        directions("up")
    assert directions(["maximize", "minimize"]) == ["maximize", "minimize"]
    with pytest.raises(ConfigError, match=r"_target_=optuna.samplers.TPESampler is not an Optuna pruner"):
        make_pruner(OmegaConf.create({"_target_": "optuna.samplers.TPESampler"}))
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.pruner \(optuna.pruners.MedianPruner\): "
                                          r"Number of startup trials cannot be negative, "):
        make_pruner(OmegaConf.create({"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": -1}))
    # a value where the group is meant (hydra.sweeper.pruner=median): how to choose one
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.pruner='median' is a value where a "
                                          r"config is meant; choose one with "
                                          r"hydra/sweeper/pruner=median \(one of: hyperband, median"):
        make_pruner("median")
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.sampler='tpe' .* hydra/sweeper/sampler=tpe"):
        group_node("tpe", "sampler")


def test_a_sweep_dir_of_another_study_and_a_study_of_other_directions_are_refused(tmp_path):
    url = storage_url(None, tmp_path)
    claim_sweep_dir(tmp_path, "a", url)
    claim_sweep_dir(tmp_path, "a", url)  # the same study: continued
    with pytest.raises(ConfigError, match=rf"hydra.sweep.dir={tmp_path} holds study 'a' of {url}, not 'b'"):
        claim_sweep_dir(tmp_path, "b", url)
    sweep = tmp_path / "other"
    optuna.create_study(study_name="s", storage=open_storage(storage_url(None, sweep)), direction="maximize")
    s = _sweeper(tmp_path, direction="minimize", study_name="s")
    s.config.hydra.sweep.dir = str(sweep)
    with pytest.raises(SearchConfigError, match=r"^config error: hydra.sweeper.direction=\['minimize'\] but "
                                                r"study 's' in .* was made with \['maximize'\]; give another"):
        s.sweep([])
    two = _sweeper(tmp_path, direction=["maximize", "minimize"],
                   pruner=OmegaConf.create({"_target_": "optuna.pruners.MedianPruner"}))
    with pytest.raises(SearchConfigError, match="cannot prune a study of several objectives; use "
                                                "hydra/sweeper/pruner=none"):
        two.sweep([])


def test_a_metric_count_other_than_the_direction_count_is_refused_before_any_trial(tmp_path):
    launcher = Launcher(lambda num: None)
    s = _sweeper(tmp_path, launcher, direction=["maximize", "minimize"])
    s.config.objective = {"metric": "best_map50"}
    with pytest.raises(SearchConfigError, match=r"^config error: objective.metric=best_map50 gives 1 "
                                                r"value\(s\) for the 2 of hydra.sweeper.direction="
                                                r"\['maximize', 'minimize'\]; give one metric per direction$"):
        s.sweep([])
    assert launcher.launched == []  # refused before any trial trains


def _no_result(num):
    raise JobsEndedError(143, [STOPPED.format(n=num)])


def test_a_trial_whose_job_returned_no_result_fails_and_the_study_goes_on(tmp_path):
    s = _sweeper(tmp_path, Launcher(_no_result), n_trials=3, n_jobs=2)  # two slots: job threads
    study = optuna.create_study(study_name="s", storage=open_storage(storage_url(None, tmp_path)))
    assert s._run_trials(study, _space(), []) == []  # no job returned anything
    assert [t.state.name for t in study.trials] == ["FAIL"] * 3
    rec = json.loads((tmp_path / "sweep" / "1" / "result.json").read_text())
    assert rec["status"] == "failed" and rec["trial"]["state"] == "FAIL"
    assert rec["trial"]["note"] == ("its job returned no result: sweep job 1 (77): stopped by SIGTERM in "
                                    "step1 at epoch 1 iteration 2")  # not the rerun advice


def test_more_failures_than_max_failure_rate_end_the_study(tmp_path):
    launcher = Launcher(_no_result)
    s = _sweeper(tmp_path, launcher, n_trials=5, max_failure_rate=0.5)
    study = optuna.create_study(study_name="s", storage=open_storage(storage_url(None, tmp_path)))
    with pytest.raises(SearchFailedError, match=r"1 of 1 trials failed, more than "
                                                r"hydra.sweeper.max_failure_rate=0.5: the study stopped"):
        s._run_trials(study, _space(), [])
    assert launcher.launched == [0] and len(study.trials) == 1


def test_a_stop_signal_ends_the_search_with_how_to_continue(tmp_path, monkeypatch):
    def stopped(num):
        raise StopRequested("SIGTERM", saved=False)

    s = _sweeper(tmp_path, Launcher(stopped))
    with pytest.raises(StopRequested):  # one slot, in this thread: the stop is not a failed trial
        s._start(False, [], 0)
    monkeypatch.setattr(s, "_sweep", lambda arguments: stopped(0))
    with pytest.raises(StopRequested) as e:
        s.sweep([])
    assert e.value.line == ("stopped by SIGTERM while the study's trials ran; trial jobs that did not get "
                            "the signal run on (on SLURM: squeue, scancel); rerun the same command to "
                            "continue the study (a trial that was running runs again as a new trial)")


def test_a_continued_study_does_not_draw_its_first_trials_values_again():
    """The sampler's seed gives the same trials for the same study; continued with 3 trials in
    it (after a kill), the seed moves on by 3: the same values again would be trials run twice."""
    s = SearchSweeper(sampler=OmegaConf.create({"_target_": "optuna.samplers.RandomSampler", "seed": 3}))
    space = search_space({"x": "interval(0, 1)"}, [])

    def draws(trials_before: int) -> list[float]:
        study = optuna.create_study(sampler=s._sampler(space, trials_before))
        return [study.ask(space.distributions).params["x"] for _ in range(3)]

    assert draws(0) == draws(0) and draws(3) == draws(3)
    assert set(draws(3)).isdisjoint(draws(0))
