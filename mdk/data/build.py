"""Build the train/val datasets from the ``dataset`` config group (conf/dataset/*.yaml)."""
from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from typing import Any, Callable, Mapping

from omegaconf import DictConfig, OmegaConf

from mdk.data.dataset import DetectionDataset
from mdk.data.image_check import POLICIES
from mdk.data.voc import DataError, check_root
from mdk.errors import import_target

log = logging.getLogger(__name__)


def _plain(cfg: Mapping[str, Any] | DictConfig) -> dict:
    if isinstance(cfg, DictConfig):
        if OmegaConf.is_missing(cfg, "root"):
            raise DataError("dataset.root is not set; pass dataset.root=/path/to/VOCdevkit/VOC2007 "
                            "(the folder holding JPEGImages/, Annotations/, ImageSets/Main/)")
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg)


def validate_dataset_cfg(cfg: Mapping[str, Any] | DictConfig) -> dict:
    """Check the ``dataset`` node; return it as a plain dict. Errors name the bad key."""
    d = _plain(cfg)
    for key in ("name", "root", "class_names", "num_classes", "train_split", "val_split"):
        if d.get(key) in (None, "???"):
            raise DataError(f"dataset.{key} is not set; see conf/dataset/{d.get('name', 'shapes')}.yaml")
    gen = d.get("generate")
    if gen is not None and not (isinstance(gen, dict) and gen.get("_target_")):
        raise DataError(f"dataset.generate={gen!r} must be null or a node with a _target_ (a "
                        "function called with root= and class_names= that makes the data)")
    names = d["class_names"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise DataError(f"dataset.class_names={names!r} must be a non-empty list of strings")
    if len(set(names)) != len(names):
        raise DataError(f"dataset.class_names={names} has duplicates; each class once")
    if d["num_classes"] != len(names):
        raise DataError(f"dataset.num_classes={d['num_classes']} but dataset.class_names lists "
                        f"{len(names)} classes; make them agree")
    reader = d.get("reader")
    if reader is not None and not (isinstance(reader, dict) and reader.get("_target_")):
        raise DataError(f"dataset.reader={reader!r} must be null or a node with a _target_ (the "
                        "Dataset class that reads one split, e.g. mdk.data.dataset.DetectionDataset)")
    if d.get("augment_on", "auto") not in ("auto", "loader", "device"):
        raise DataError(f"dataset.augment_on={d['augment_on']!r} must be auto, loader or device")
    nw = d.get("num_workers", 0)
    if nw != "auto" and (isinstance(nw, bool) or not isinstance(nw, int) or nw < 0):
        raise DataError(f"dataset.num_workers={nw!r} must be an integer >= 0 or auto")
    if d.get("on_bad_image", "error") not in POLICIES:
        raise DataError(f"dataset.on_bad_image={d['on_bad_image']!r} must be one of "
                        f"{list(POLICIES)} (error: stop naming the file; skip: leave bad images "
                        "out of the index and list them in the log)")
    return d


def meta_dir_for(d: Mapping[str, Any], cache_root: str | Path) -> Path:
    """Meta files live per dataset root, so two roots never overwrite each other's meta files."""
    if d.get("meta_dir"):
        return Path(d["meta_dir"]).expanduser()
    tag = hashlib.sha1(str(Path(d["root"]).expanduser().resolve()).encode()).hexdigest()[:8]
    return Path(cache_root).expanduser() / "meta" / f"{d['name']}-{tag}"


def build_datasets(cfg_dataset: Mapping[str, Any] | DictConfig, image_size: int, grid: int,
                   boxes_per_cell: int, seed: int, cache_root: str | Path
                   ) -> tuple[DetectionDataset, DetectionDataset]:
    """(train, val) datasets of the folder ``dataset.root``, each built by ``dataset.reader``
    (``_target_``: the Dataset class, ``DetectionDataset`` for VOC layout; null means that one)
    with ``split=``, ``augment=`` and the common arguments below. A dataset with a ``generate``
    node (``_target_``: the built-in shapes generator) first makes its data there (a no-op when it
    is already there). Any dataset is a YAML in conf/dataset/; its ``name`` only labels its
    folders (checkpoints, meta files). Under DDP call it on rank 0 first and
    barrier, so one process generates (concurrent calls are still safe: writes are atomic)."""
    from hydra.utils import instantiate

    d = validate_dataset_cfg(cfg_dataset)
    root = Path(d["root"]).expanduser()
    if d.get("generate"):
        gen = {"image_size": image_size, **d["generate"]}
        instantiate(gen, root=root, class_names=d["class_names"])
    check_root(root)
    meta_dir = meta_dir_for(d, cache_root)
    common = dict(root=root, class_names=d["class_names"], image_size=image_size, grid=grid,
                  boxes_per_cell=boxes_per_cell, meta_dir=meta_dir,
                  cache_images=bool(d.get("cache_images", False)), seed=seed,
                  on_bad_image=str(d.get("on_bad_image", "error")))
    reader = _reader(d.get("reader"))
    train = reader(split=d["train_split"], augment=bool(d.get("augment", True)), **common)
    val = reader(split=d["val_split"], augment=False, **common)
    return train, val


def _reader(node: Mapping[str, Any] | None) -> Callable[..., DetectionDataset]:
    """``dataset.reader`` as a callable: its ``_target_`` class with the node's other keys bound.
    Called directly rather than through ``instantiate`` so that a DataError raised while reading
    a split reaches the user as itself, not wrapped in Hydra's InstantiationException."""
    if not node:
        return DetectionDataset
    cls = import_target(node["_target_"], "dataset.reader._target_",
                        "name a Dataset class as package.module.Class", DataError)
    return functools.partial(cls, **{k: v for k, v in node.items() if not k.startswith("_")})
