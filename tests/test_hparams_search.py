"""Hyperparameter search: `python run.py -m hparams_search=<name>` (an Optuna study through
hydra-optuna-sweeper) and the objective a run returns (launchers/hydra_app/objective.py).

The study test runs the shipped search config on the tiny model; SLURM runs of a study are in
test_slurm_search.py.
"""
from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import REPO, TINY, compose, run_cmd_env
from launchers.hydra_app.objective import FailedRun, StageResults, with_objective
from mdk.engine.result import StageResult

# optuna 2.10's study storage on SQLAlchemy 1.4 (pinned: its RDB storage fails on 2.x) warns on
# import: optuna is imported inside the tests, where this filter applies.
pytestmark = pytest.mark.filterwarnings("ignore:Deprecated API features detected")

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


def test_objective_refuses_what_would_break_the_study():
    with pytest.raises(ValueError, match="objective.stage=step3 did not run"):
        float(StageResults(PIPELINE[:1], ["step1"], "best_map50", "step3"))
    with pytest.raises(ValueError, match="objective.metric=best_map50: no value in the results of stage step4"):
        float(StageResults(PIPELINE, STAGES, "best_map50", "step4"))
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=f"final_loss of step1 is {bad}"):
            float(StageResults([StageResult("step1", final_loss=bad)], ["step1"], "final_loss"))
    failed = FailedRun({"status": "failed", "error": "ConfigError: optim.lr=-1.0 must be > 0\nmore"})
    with pytest.raises(TypeError):
        float(failed)
    assert str(failed) == "run failed: ConfigError: optim.lr=-1.0 must be > 0"


def test_a_nan_value_would_end_an_optuna_study():
    """Why the objective raises instead of returning NaN: the sweeper tells COMPLETE with the value,
    and on the error tells FAIL with the same value, which optuna 2.10 refuses too."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    trial = study.ask()
    with pytest.raises(ValueError, match="returned nan"):
        study.tell(trial, state=optuna.trial.TrialState.COMPLETE, values=[math.nan])
    with pytest.raises(ValueError, match="Values cannot be specified"):
        study.tell(trial, state=optuna.trial.TrialState.FAIL, values=[math.nan])
    study.tell(trial, state=optuna.trial.TrialState.FAIL)  # what a non-float return gets
    assert study.trials[0].state == optuna.trial.TrialState.FAIL


def test_with_objective_wraps_results_and_failures():
    cfg = compose([*TINY, "trainer.device=cpu", "pipeline=[step1,step2]", "objective.stage=step1"])
    res = with_objective(cfg, PIPELINE[:2])
    assert isinstance(res, StageResults) and float(res) == 0.5
    failed = with_objective(cfg, {"status": "failed", "error": "boom"})
    assert isinstance(failed, FailedRun) and failed["error"] == "boom"
    no_search = OmegaConf.create({"pipeline": [], "step": {"name": "step1"}})  # no `objective`
    assert type(with_objective(no_search, PIPELINE[:1])) is list


def test_shipped_search_config_composes_an_optuna_study():
    from hydra import compose as hcompose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hcompose("config", overrides=["hparams_search=lr_warmup"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == 0
    assert set(sweeper.params) == {"optim.lr", "scheduler.warmup.iters", "scheduler"}
    assert sweeper.max_failure_rate == 1.0 and cfg.hydra.callbacks.sweep.fail_on_error is False
    assert cfg.objective.metric == "best_map50" and cfg.objective.stage is None


@pytest.mark.slow
def test_three_trial_study_records_the_failed_trial_and_finds_the_best(tmp_path, shared_data):
    """Three trials of the shipped search config over lr in {0.002, -1.0, 0.004} (the random
    sampler with seed 1 draws them in the order -1.0, 0.002, 0.004): the first run fails its
    config check, the study goes on, and the best value is the better job's final loss."""
    import optuna

    db = tmp_path / "study.db"
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(REPO / "run.py"), "-m", "hparams_search=lr_warmup",
           "hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=1", "hydra.sweeper.params=null",
           "optim.lr=choice(0.002,-1.0,0.004)", "hydra.sweeper.n_trials=3",
           "objective.metric=final_loss", "hydra.sweeper.direction=minimize",
           f"hydra.sweeper.storage=sqlite:///{db}", "hydra.sweeper.study_name=t",
           *TINY, "trainer.epochs=1", "trainer.limit_train_batches=2", "trainer.device=cpu",
           f"paths.data={shared_data}", f"hydra.sweep.dir={sweep}"]
    res = subprocess.run(cmd, env=run_cmd_env(), capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{db}")
    states = [(t.params["optim.lr"], t.state.name) for t in study.trials]
    assert states == [(-1.0, "FAIL"), (0.002, "COMPLETE"), (0.004, "COMPLETE")]
    jobs = {j["job"]: j for j in json.loads((sweep / "sweep_summary.json").read_text())["jobs"]}
    assert jobs["0"]["status"] == "failed" and "optim.lr=-1.0 must be > 0" in jobs["0"]["error"]
    losses = {t.number: t.value for t in study.trials if t.value is not None}
    assert losses == {1: jobs["1"]["final_loss"], 2: jobs["2"]["final_loss"]}  # trial n = job n
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert isinstance(best.best_value, float) and best.best_value == min(losses.values())
    assert best.best_value == study.best_value
    assert "optim.lr" in (sweep / "sweep_summary.txt").read_text()  # the table keeps working
