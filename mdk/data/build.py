"""Build the train/val datasets from the ``dataset`` config group (conf/dataset/*.yaml).

``reader._target_`` names the class that reads the format into records (:mod:`mdk.data.records`);
``generate._target_`` optionally makes the data first.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, Mapping, Optional

from omegaconf import DictConfig

from mdk.data.config import VOC_READER, check, plain
from mdk.data.dataset import DetectionDataset
from mdk.data.index import cached_records, fresh_count
from mdk.data.records import READER_METHODS, Reader, Record, only_in_val
from mdk.data.report import cell_capacity, short_report
from mdk.targets import build
from mdk.errors import DataError
from mdk.paths import resolve_path

log = logging.getLogger(__name__)


def meta_dir_for(d: Mapping[str, Any], cache_root: str | Path) -> Path:
    """Meta files live per dataset root, so two roots never overwrite each other's meta files."""
    if d.get("meta_dir"):
        return Path(d["meta_dir"]).expanduser()
    tag = hashlib.sha1(str(Path(d["root"]).expanduser().resolve()).encode()).hexdigest()[:8]
    return Path(cache_root).expanduser() / "meta" / f"{d['name']}-{tag}"


def build_reader(d: Mapping[str, Any], root: str | Path) -> Reader:
    """The reader of ``dataset.reader``, called with ``root=``, ``class_names=`` and the node's
    other keys; null: :class:`~mdk.data.voc.VOCReader`. Its DataError reaches the user as itself."""
    node = d.get("reader") or {"_target_": VOC_READER}
    hint = "name a reader class as package.module.Class"
    cls = build(node, "dataset.reader", error=DataError, hint=hint, check=True)
    if not all(callable(getattr(cls, m, None)) for m in READER_METHODS):
        raise DataError(f"dataset.reader._target_={node['_target_']!r} is not a dataset reader (it "
                        f"needs the methods {', '.join(READER_METHODS)}: mdk/data/records.py); "
                        "name a reader class such as mdk.data.voc.VOCReader")
    return build(node, "dataset.reader", error=DataError, hint=hint, root=root,
                 class_names=list(d.get("class_names") or []))


def check_dataset_files(cfg_dataset: Mapping[str, Any] | DictConfig, base: str | Path,
                        cache_root: Optional[str | Path] = None) -> int:
    """Pre-flight in the launching process: the reader checks both splits' files (unless the data
    is generated, or the split's index cache is fresh). Return the number of train images (0 when
    unknown). Relative paths are taken under ``base`` (the cwd), as the engine does."""
    d = plain(cfg_dataset)
    root = resolve_path(d["root"], base)
    reader = build_reader(d, root)
    if d.get("generate"):  # generated on first use: its size is the config's
        return int(d["generate"].get("num_train", 0) or 0)
    meta_dir = (meta_dir_for({**d, "root": str(root)}, resolve_path(cache_root, base))
                if cache_root else None)
    counts = {}
    for split in (d["train_split"], d["val_split"]):
        n = fresh_count(reader, split, meta_dir / f"{split}.txt") if meta_dir else None
        if n is None:
            reader.check([split])
            n = reader.count(split)
        counts[split] = n
    return counts[d["train_split"]]


def split_records(cfg_dataset: Mapping[str, Any] | DictConfig, image_size: int,
                  cache_root: str | Path) -> dict[str, list[Record]]:
    """The train and val records through the index cache (no image check): what a report on the
    data needs. A ``generate`` node first makes the data."""
    d = check(cfg_dataset)
    root = Path(d["root"]).expanduser()
    if d.get("generate"):
        build({"image_size": image_size, **d["generate"]}, "dataset.generate", error=DataError,
              root=root, class_names=list(d["class_names"]),
              hint="name a function as package.module.function")
    reader = build_reader(d, root)
    meta_dir = meta_dir_for(d, cache_root)
    return {split: cached_records(reader, split, meta_dir)
            for split in dict.fromkeys((d["train_split"], d["val_split"]))}


def build_datasets(cfg_dataset: Mapping[str, Any] | DictConfig, image_size: int, grid: int,
                   head: Any, seed: int, cache_root: str | Path,
                   progress: Any = "auto", train: bool = True
                   ) -> tuple[Optional[DetectionDataset], DetectionDataset]:
    """(train, val) datasets of ``dataset.root``, records read through the index cache under
    ``cache_root``; a ``generate`` node first makes the data. Under DDP call it on rank 0 first
    and barrier, so one process generates and indexes (concurrent calls are still safe).
    ``head``: the model's head, which encodes the targets. ``progress``: the image check's bar.
    ``train=False``: the val split alone (None for train)."""
    d = check(cfg_dataset)
    root = Path(d["root"]).expanduser()
    if d.get("generate"):  # with the model's image_size unless the node sets it
        build({"image_size": image_size, **d["generate"]}, "dataset.generate", error=DataError,
              root=root, class_names=list(d["class_names"]),
              hint="name a function as package.module.function")
    reader = build_reader(d, root)   # its records() and sources() raise what check() would
    meta_dir = meta_dir_for(d, cache_root)

    def one(split: str, augment: bool) -> DetectionDataset:
        return DetectionDataset(
            root=root, split=split, records=cached_records(reader, split, meta_dir),
            class_names=d["class_names"], image_size=image_size, grid=grid, head=head,
            augment=augment, meta_dir=meta_dir, cache_images=bool(d.get("cache_images", False)),
            seed=seed, on_bad_image=str(d.get("on_bad_image", "error")), progress=progress,
            augmentation=d.get("augmentation"))

    train_ds = one(d["train_split"], bool(d.get("augment", True))) if train else None
    val_ds = one(d["val_split"], False)
    if train_ds is not None:
        line = only_in_val(train_ds.records, val_ds.records, d["class_names"])
        if line:
            log.warning("%s: %s", root, line)
        log.info("%s", short_report(train_ds.records, d["class_names"], image_size,
                                    image_size // grid, cell_capacity(head)))
    return train_ds, val_ds
