"""A search's study, the same for the sweeping process and each trial's run: where it is stored,
how it is opened, its pruner, and what a killed sweep left behind (docs/cluster.md, "Searches").
Every process talks to the study through its storage, never the sweeper's memory; one sweep at a
time per study. Optuna is imported inside the functions: Hydra imports the sweeper plugin at
every start.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import OmegaConf

from launchers.reports.sweep_results import RESULT
from mdk.atomic_file import write_json
from mdk.targets import build
from mdk.compose import CONF_DIR
from mdk.errors import ConfigError

log = logging.getLogger(__name__)

SWEEPER = "hydra_plugins.mdk_optuna.OptunaSweeper"  # hydra.sweeper._target_
JOURNAL = "optuna_journal.log"
MARKER = "optuna_study.json"  # which study a sweep dir holds (one study per sweep dir)
RETRY_OF, JOB_DIR = "retry_of", "job_dir"  # trial user attributes


def storage_url(storage: Optional[str], sweep_dir: Path) -> str:
    """The study's storage as one string every process can open (paths made absolute)."""
    if storage is None or str(storage) == "":
        return str((Path(sweep_dir) / JOURNAL).absolute())
    storage = str(storage)
    return storage if "://" in storage else str(Path(storage).absolute())


def open_storage(url: str) -> Any:
    import optuna  # optuna: only in a search (see top)

    if "://" in url:
        return optuna.storages.RDBStorage(url)
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    backend = optuna.storages.journal.JournalFileBackend(url)
    return optuna.storages.JournalStorage(backend)


def directions(direction: Any) -> list[str]:
    """``direction: maximize`` or ``[maximize, minimize]`` (one per objective metric)."""
    dirs = [direction] if isinstance(direction, str) else list(direction or [])
    bad = [d for d in dirs if d not in ("maximize", "minimize")]
    if not dirs or bad:
        raise ConfigError(f"hydra.sweeper.direction={direction!r} must be maximize, minimize or a "
                          "list of them (one per objective.metric)")
    return [str(d) for d in dirs]


def group_node(node: Any, key: str) -> Any:
    """``hydra.sweeper.<key>`` must be a node; a plain value there (``hydra.sweeper.pruner=median``)
    is one line saying how to choose one."""
    if node is None or OmegaConf.is_dict(node) or isinstance(node, dict):
        return node
    options = ", ".join(sorted(p.stem for p in (CONF_DIR / "hydra" / "sweeper" / key).glob("*.yaml")))
    raise ConfigError(f"hydra.sweeper.{key}={node!r} is a value where a config is meant; choose "
                      f"one with hydra/sweeper/{key}={node} (one of: {options}), and set its "
                      f"arguments as hydra.sweeper.{key}.<name>=...")


def make_pruner(node: Any) -> Any:
    """``hydra.sweeper.pruner`` as an Optuna pruner (NopPruner when none)."""
    import optuna  # optuna: only in a search (see top)

    node = group_node(node, "pruner")
    if node is None or not node.get("_target_"):
        return optuna.pruners.NopPruner()
    pruner = build(node, "hydra.sweeper.pruner")
    if not isinstance(pruner, optuna.pruners.BasePruner):
        raise ConfigError(f"hydra.sweeper.pruner._target_={node.get('_target_')} is not an "
                          "Optuna pruner")
    return pruner


def open_trial(name: str, url: str, number: int, pruner: Any = None) -> Any:
    """Trial ``number`` of the existing study ``name``, for a run to report to (its sampler is
    never asked: a random one costs nothing)."""
    import optuna  # optuna: only in a search (see top)

    storage = open_storage(url)
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(name), number)
    study = optuna.load_study(study_name=name, storage=storage, pruner=pruner,
                              sampler=optuna.samplers.RandomSampler())
    return optuna.trial.Trial(study, trial_id)


def claim_sweep_dir(sweep_dir: Path, name: str, url: str) -> None:
    """Record the study of this sweep dir; refuse a dir that holds another study's trials (their
    job dirs are numbered by trial, so two studies would share them)."""
    marker = Path(sweep_dir) / MARKER
    here = {"study_name": name, "storage": url}
    if marker.is_file():
        old = json.loads(marker.read_text())
        if old != here:
            raise ConfigError(
                f"hydra.sweep.dir={sweep_dir} holds study {old.get('study_name')!r} of "
                f"{old.get('storage')}, not {name!r} of {url}; give this study its own "
                "hydra.sweep.dir (or the same study_name and storage to continue that one)")
        return
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(here, indent=1) + "\n")


def fail_stale_trials(study: Any) -> dict[int, str]:
    """Fail the RUNNING trials a killed sweep left, retrying each once; {trial number: note}."""
    import optuna  # optuna: only in a search (see top)

    notes = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        again = RETRY_OF not in t.user_attrs
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        notes[t.number] = "the sweep stopped while this trial ran; " + (
            "it runs again as a new trial" if again else "not retried: it was a retry already")
        log.warning("trial %d: %s", t.number, notes[t.number])
        if again:
            study.enqueue_trial(t.params, user_attrs={RETRY_OF: t.number})
    return notes


def finished(study: Any) -> list[Any]:
    """The study's COMPLETE, PRUNED and FAIL trials (what counts towards n_trials)."""
    import optuna  # optuna: only in a search (see top)

    s = optuna.trial.TrialState
    return study.get_trials(deepcopy=False, states=(s.COMPLETE, s.PRUNED, s.FAIL))


def write_best(study: Any, path: Path, dirs: Sequence[str]) -> None:
    """``optimization_results.yaml``: the best trial (one objective) or the Pareto front."""
    import optuna  # optuna: only in a search (see top)

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        log.warning("no trial of study %s completed: no optimization_results.yaml", study.study_name)
        return
    out: dict[str, Any] = {"name": "optuna", "study_name": study.study_name}
    if len(dirs) == 1:
        best = study.best_trial
        out.update(best_trial=best.number, best_params=best.params, best_value=best.value)
    else:
        out.update(directions=list(dirs), solutions=[
            {"trial": t.number, "params": t.params, "values": t.values} for t in study.best_trials])
    OmegaConf.save(OmegaConf.create(out), path)


def trial_record(trial: Any, note: Optional[str] = None) -> dict[str, Any]:
    """What the sweep table shows of a finished trial (in its job's result.json)."""
    steps = sorted(trial.intermediate_values)
    return {"number": trial.number, "state": trial.state.name, "values": trial.values,
            "epoch": steps[-1] if steps else None,
            **({RETRY_OF: trial.user_attrs[RETRY_OF]} if RETRY_OF in trial.user_attrs else {}),
            **({"note": note} if note else {})}


def record_in_job(trial: Any, note: Optional[str] = None) -> None:
    """Add the trial's record to its job's result.json (made if missing)."""
    job_dir = trial.user_attrs.get(JOB_DIR)
    if not job_dir:
        return
    result_file = Path(job_dir) / RESULT
    try:
        rec = json.loads(result_file.read_text()) if result_file.is_file() else {}
    except (ValueError, OSError):
        rec = {}
    rec.setdefault("status", "failed" if trial.state.name == "FAIL" else "incomplete")
    rec["trial"] = trial_record(trial, note)
    write_json(result_file, rec, indent=1)
