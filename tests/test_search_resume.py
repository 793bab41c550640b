"""A search's study outlives its sweeping process, and its trials fill every slot.

* killed with SIGKILL while its 4th trial runs, the same command again continues the study from
  its journal: the 3 finished trials are not rerun, the one that was running is FAIL and runs
  once more as a new trial with the same parameters, and the study ends with exactly n_trials=6;
* with n_jobs=2 a new trial starts as soon as one ends: trial 2 starts while trial 1 (held 20 s at
  its 3rd step, MDK_FAULT=hold:iter:3) still runs, once the short trial 0 is done
  (submitit_local: real job processes watched by the sweeper).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import optuna
import pytest

from conftest import run_cmd_env
from launchers.hydra_app.optuna_study import open_storage, storage_url
from helpers.search import _search

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(sweep):
    return optuna.load_study(study_name="t", storage=open_storage(storage_url(None, sweep)))


def _states(sweep) -> list[str]:
    try:
        return [t.state.name for t in _study(sweep).trials]
    except (KeyError, OSError, ValueError):  # no journal or no study yet
        return []


def _result(sweep, n: int) -> dict:
    return json.loads((sweep / str(n) / "result.json").read_text())


def test_killed_study_resumes_to_exactly_n_trials_and_runs_no_trial_twice(tmp_path, shared_data):
    sweep = tmp_path / "sweep"
    cmd = _search(sweep, "optim.lr=choice(0.005,0.004,0.003,0.002)", "hydra/sweeper/sampler=random",
                  "hydra.sweeper.sampler.seed=3", "trainer.epochs=2", "hydra.sweeper.n_trials=6",
                  f"paths.data={shared_data}")
    out = tmp_path / "first.log"
    with out.open("w") as f:
        proc = subprocess.Popen(cmd, env=run_cmd_env(), stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    # the 4th trial asked and its job started (its result.json says running)
    while _states(sweep) != ["COMPLETE"] * 3 + ["RUNNING"] or not (sweep / "3" / "result.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, (_states(sweep), out.read_text()[-3000:])
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)  # the sweep and the trial running in it die at once
    proc.wait()
    killed_at = time.time()
    before = [_result(sweep, n) for n in range(3)]
    params = [t.params for t in _study(sweep).trials]

    res = subprocess.run(cmd, env=run_cmd_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    study = _study(sweep)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3 + ["FAIL"] + ["COMPLETE"] * 2
    assert [t.params for t in study.trials[:4]] == params  # the finished trials stay as they were
    assert study.trials[4].params == params[3] and study.trials[4].user_attrs["retry_of"] == 3
    assert "retry_of" not in study.trials[5].user_attrs
    for n in range(3):  # not run again: their job's record is the one written before the kill
        assert _result(sweep, n) == before[n] and before[n]["started"] < killed_at
    for n in range(6):  # every trial its own job dir, each run once
        rec = _result(sweep, n)
        assert rec["attempts"] == 1 and rec["trial"]["number"] == n
        assert rec["trial"]["state"] == study.trials[n].state.name
    killed = _result(sweep, 3)
    assert killed["status"] == "running" and "the sweep stopped while this trial ran" in killed["trial"]["note"]
    for n in (4, 5):
        assert _result(sweep, n)["started"] > killed_at and study.trials[n].value == _result(sweep, n)["final_loss"]
    assert "trial 3: the sweep stopped while this trial ran; it runs again" in res.stderr + res.stdout
    table = (sweep / "sweep_summary.txt").read_text()
    assert "5 COMPLETE, 1 FAIL of 6 trials" in table and "retry of 3" in table

    again = subprocess.run(cmd, env=run_cmd_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and len(_study(sweep).trials) == 6  # done: the same command adds none
    assert "6 of 6 trials done, 0 to run" in again.stderr + again.stdout


@pytest.mark.slow
def test_two_slots_start_the_next_trial_when_one_ends_not_after_the_batch(tmp_path, shared_data):
    sweep = tmp_path / "sweep"
    study = optuna.create_study(study_name="t", storage=open_storage(storage_url(None, sweep)),
                                direction="minimize")
    for epochs in (1, 2, 1):  # trial 1 reaches step 3 and is held there; 0 and 2 never do
        study.enqueue_trial({"trainer.epochs": epochs})
    env = dict(run_cmd_env(), MDK_FAULT="hold:iter:3")
    res = subprocess.run(_search(sweep, "trainer.epochs=choice(1,2)", "hydra.sweeper.n_trials=3",
                                 "hydra.sweeper.n_jobs=2", "hydra/launcher=submitit_local",
                                 "hydra.launcher.gpus_per_node=0", f"paths.data={shared_data}"),
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    trials = _study(sweep).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    # each job process reported its epochs to the study itself (pruning works under submitit_local)
    assert [sorted(t.intermediate_values) for t in trials] == [[1], [1, 2], [1]]
    r = [_result(sweep, n) for n in range(3)]
    end = [x["started"] + x["wall_s"] for x in r]
    assert r[1]["wall_s"] >= 20  # held
    assert end[0] <= r[2]["started"] < end[1] - 5, (r[2]["started"], end)  # no idle slot
    assert len({x["job_id"] for x in r}) == 3  # one submitit job per trial
