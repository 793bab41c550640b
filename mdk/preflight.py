"""Checks in the launching process before any worker is spawned or any data is built: the
machine, dataset files, the folders the run writes, and the first stage's starting checkpoint.
Each raises the error the engine would raise later, seconds after the command instead. The
free-space estimate: docs/errors.md, #74; paths.data may be read-only when nothing is written there.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from mdk.checkpoint.files import load_checkpoint
from mdk.targets import build
from mdk.checkpoint.meaning import check_resume
from mdk.checkpoint.weights_file import (OWN, input_advice, load_start, of_checkpoint,
                                         read_weights)
from mdk.data.build import check_dataset_files, meta_dir_for
from mdk.data.config import plain
from mdk.data import shapes, shapes_hard
from mdk.errors import CheckpointError, ConfigError, DataError, DiskError
from mdk.models.build import build_model
from mdk.paths import resolve_path
from mdk.checkpoint.layout import RESUME_NAMES, StageCheckpointer
from mdk.stage_config import KINDS, StageConf, running_stages
from mdk.world import backend_for, check_local_size

MB = 1 << 20
RUN_DIR_PER_STAGE = 4 * MB  # a stage's log lines, TensorBoard events and report PNGs (0.3-3 MB)
CACHE_PER_IMAGE = 256       # an image's line in the index and its entry in the image check
# A checkpoint: the weights, two optimizer moments, an EMA copy, then RNG states and the config.
CHECKPOINT_COPIES, CHECKPOINT_EXTRA = 4, 1 * MB


def check_environment(cfg: DictConfig) -> None:
    """Checks against this machine: CUDA, GPU count, NCCL."""
    backend_for(cfg.trainer.device, cfg.dist.backend)
    check_local_size(cfg.trainer.device, int(cfg.dist.gpus))


def probe(path: Path, key: str, value: Any = None) -> Path:
    """The folder ``path`` is or will be made in, after a real write there (as root,
    ``os.access`` says yes on read-only mounts): ConfigError naming ``key`` (set to ``value``,
    default ``path``) when it takes no file."""
    q = path  # or its nearest existing ancestor: the folder a write under ``path`` starts in
    while not q.exists() and q != q.parent:
        q = q.parent
    path = str(path if value is None else value)
    if not q.is_dir():
        raise ConfigError(f"{key}={path!r}: {q} is a file, not a folder; choose "
                          f"another {key}")
    try:
        with tempfile.TemporaryFile(dir=q, prefix=".mdk-write-probe-"):
            pass
    except OSError as e:
        raise ConfigError(f"{key}={path!r}: {q} is not writable (creating a file there "
                          f"failed: {e.strerror}); choose a folder you can write to") from None
    return q


def checkpoint_bytes(cfg: DictConfig) -> int:
    """About how large one checkpoint of this model is."""
    weights = sum(v.numel() * v.element_size() for v in build_model(cfg).state_dict().values())
    return CHECKPOINT_COPIES * weights + CHECKPOINT_EXTRA


# The built-in generators' disk-use estimates (0 when the folder holds the data already).
GENERATOR_SIZES = {shapes.ensure_shapes_dataset: shapes.bytes_to_generate,
                   shapes_hard.ensure_shapes_hard_dataset: shapes_hard.bytes_to_generate}


def _needs(cfg: DictConfig, base: Path, run_dir: Optional[Path]) -> list[tuple[Path, int, str]]:
    """(folder, bytes, what) the run writes: each probed, then added up per disk."""
    ck_root = resolve_path(cfg.paths.checkpoints, base)
    one = checkpoint_bytes(cfg)
    files = sum(1 + sum(not (ck_root / s / n).is_file() for n in RESUME_NAMES)
                for s in running_stages(cfg))
    out = [(probe(ck_root, "paths.checkpoints"), files * one,
            f"paths.checkpoints: {files} checkpoint files of ~{one / MB:.1f} MB")]
    if run_dir is not None:
        stages = len(running_stages(cfg))
        out.append((probe(Path(run_dir), "hydra.run.dir"), stages * RUN_DIR_PER_STAGE,
                    f"the run dir: {stages * RUN_DIR_PER_STAGE / MB:.0f} MB of logs and report "
                    "pictures"))
    d = plain(cfg.dataset)
    gen = d.get("generate")
    if gen:
        root = resolve_path(d["root"], base)
        params = {k: v for k, v in gen.items() if not k.startswith("_")}
        params.setdefault("image_size", int(cfg.model.image_size))
        # With the arguments the run gives it: a key the generator does not take is one line.
        fn = build(gen, "dataset.generate", error=DataError, check=True, root=root,
                   hint="name a function as package.module.function",
                   class_names=d["class_names"], image_size=params["image_size"])
        # Another generator's size is unknown: its folder must only take files.
        size_of = GENERATOR_SIZES.get(fn)
        need = size_of(root, class_names=d["class_names"], **params) if size_of else 1
        if need:
            data = resolve_path(cfg.paths.data, base)
            key, value = ("paths.data", cfg.paths.data) if root.is_relative_to(data) else \
                ("dataset.root", d["root"])
            out.append((probe(root.parent, key, value), need,
                        f"{key}: {need / MB:.1f} MB of generated images and annotations"))
            n = int(params.get("num_train", 0)) + int(params.get("num_val", 0))
            key, value = ("dataset.meta_dir", d["meta_dir"]) if d.get("meta_dir") else \
                ("paths.data", cfg.paths.data)
            out.append((probe(meta_dir_for({**d, "root": str(root)}, data), key, value),
                        n * CACHE_PER_IMAGE, f"the index of {n} images"))
    return out


def check_paths(cfg: DictConfig, base: str | Path, run_dir: Optional[Path] = None) -> None:
    """Every folder the run writes takes files (else ConfigError), and each disk has the free
    space its folders need (else DiskError with the estimate)."""
    by_disk: dict[int, list[tuple[Path, int, str]]] = {}
    for folder, need, what in _needs(cfg, Path(base), run_dir):
        by_disk.setdefault(os.stat(folder).st_dev, []).append((folder, need, what))
    for parts in by_disk.values():
        need = sum(n for _, n, _ in parts)
        free = shutil.disk_usage(parts[0][0]).free
        if free < need:
            raise DiskError(f"{parts[0][0]}: not enough free space: {free / MB:.1f} MB free, "
                            f"this run writes about {need / MB:.1f} MB on that disk ("
                            + "; ".join(w for _, _, w in parts) + "); free space there or "
                            "point these paths at another disk")


def train_images(cfg: DictConfig) -> int:
    """The number of train images, checking the files of both splits on the way."""
    base = os.getcwd()
    return check_dataset_files(cfg.dataset, base, resolve_path(cfg.paths.data, base))


def _check_dataset(cfg: DictConfig) -> None:
    n_train = train_images(cfg)
    batch = int(cfg.trainer.batch_size)
    if n_train and n_train < batch and StageConf.from_node(cfg.step).kind in KINDS:
        where = ("dataset.generate.num_train" if cfg.dataset.get("generate")
                 else f"the {cfg.dataset.train_split!r} split of {cfg.dataset.root}")
        raise DataError(f"{where} has {n_train} images, fewer than one global batch "
                        f"(trainer.batch_size={batch}); the last partial batch of an epoch is "
                        "dropped, so nothing would train: lower trainer.batch_size or add images")


def _check_start(cfg: DictConfig) -> None:
    """The first stage's starting point (its resumable files, else its input checkpoint) means
    what this config means (mdk/checkpoint/meaning.py) and fits the model. The meaning is checked
    first, so a changed class list is named as such rather than as a shape mismatch."""
    spec = StageConf.from_node(cfg.step)
    checkpoints = StageCheckpointer(cfg, spec)
    own = [checkpoints.dir / n for n in RESUME_NAMES if (checkpoints.dir / n).is_file()]
    if cfg.trainer.resume and own:
        # an unreadable file: the engine falls back from it with a warning (from all of them:
        # to the stage's input, checked below)
        ck, path = next(((c, p) for p in own if (c := _readable(p)) is not None), (None, None))
        if ck is not None:
            check_resume(ck, path, cfg, spec)
            _check_fits(build_model(cfg), ck, path,
                        f"it is {spec.name}'s own checkpoint from an earlier run: use another "
                        "paths.checkpoints, or trainer.resume=false to start this stage over")
            return
    init = checkpoints.input_path()  # MissingStageInput names the stage to run first
    if init is None:
        return
    model = build_model(cfg)  # what the engine does with it: its meaning, then its tensors
    load_start(model, read_weights(init, input_advice(spec)), cfg, spec)


def _readable(path: Path) -> Optional[dict]:
    try:
        return load_checkpoint(path)
    except CheckpointError:
        return None


def _check_fits(model, ck, path, advice: str) -> None:
    try:
        of_checkpoint(path, ck).load(model, OWN)
    except CheckpointError as e:
        raise CheckpointError(f"{e} ({advice})") from None


def preflight(cfg: DictConfig, run_dir: Optional[Path] = None) -> None:
    """Raise a user error before any work. ``cfg``: the validated, resolved config of the first
    stage to run; ``run_dir``: the run's output folder, probed with the others."""
    check_environment(cfg)
    check_paths(cfg, os.getcwd(), run_dir)
    _check_dataset(cfg)
    _check_start(cfg)
