"""Class names read from the data when ``dataset.class_names`` is left out (null): the reader's
``data_class_names(train_split, val_split)`` (VOC: the sorted set of object names of the train
split; COCO: the train file's categories by id; YOLO: data.yaml's names). ``dataset.num_classes``
follows from the list unless set, then it must agree. The list goes into the config before any
check or stage, so the checkpoint's meaning stores it as a list typed by hand: a resume or the
next stage refuses another order.

What was read is cached beside the dataset index (``<meta dir>/class_names.json``), keyed by the
bytes of both splits' annotation files, so a large COCO file is not parsed again to learn what
it said last time.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from mdk.atomic_file import write_json
from mdk.data.build import build_reader, meta_dir_for
from mdk.data.config import plain
from mdk.data.index import content_key
from mdk.errors import ConfigError, DataError
from mdk.paths import resolve_path

log = logging.getLogger(__name__)

CACHE = "class_names.json"


def _unset(node: DictConfig, key: str) -> bool:
    return OmegaConf.is_missing(node, key) or node.get(key) is None


def read_class_names(d: Mapping[str, Any], root: Path, cache_root: Optional[Path] = None
                     ) -> list[str]:
    """The class list the data of ``d`` (a plain dataset node) gives, through the cache under
    ``cache_root`` (None: no cache)."""
    if d.get("generate"):
        raise DataError("dataset.class_names is not set; a generated dataset (dataset.generate) "
                        "draws the classes it is given: set dataset.class_names=[...]")
    reader = build_reader({**d, "class_names": []}, root)
    read = getattr(reader, "data_class_names", None)
    if not callable(read):
        kind = type(reader)
        raise DataError(f"dataset.class_names is not set and {kind.__module__}.{kind.__qualname__}"
                        " cannot read them from the data (it has no data_class_names method); set "
                        "dataset.class_names=[...]")
    train, val = str(d["train_split"]), str(d["val_split"])
    reader.check([train, val])
    cache = meta_dir_for({**d, "root": str(root)}, cache_root) / CACHE if cache_root else None
    key = {"reader": f"{type(reader).__module__}.{type(reader).__qualname__}", "splits": [train, val],
           "content": content_key(root, [*reader.sources(train), *reader.sources(val)])}
    if cache is not None:
        try:
            held = json.loads(cache.read_text())
            if isinstance(held, dict) and {k: held.get(k) for k in key} == key:
                return list(held["names"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    names = [str(n) for n in read(train, val)]
    if cache is not None:
        try:
            write_json(cache, {**key, "names": names})
        except OSError as exc:  # an unwritable cache costs a re-read next time, not the run
            log.warning("could not write %s (%s); the class names are read again next time",
                        cache, exc.strerror or exc)
    return names


def fill_class_names(cfg: DictConfig, base: str | Path | None = None) -> None:
    """Set ``dataset.class_names`` from the data when it is null, and ``dataset.num_classes``
    from the list when it is null (else check it). Relative paths are taken under ``base`` (the
    cwd), as the engine does."""
    node = cfg.dataset
    base = Path(base or os.getcwd())
    if _unset(node, "class_names"):
        d = plain(node)
        cache_root = OmegaConf.select(cfg, "paths.data", default=None)
        names = read_class_names(d, resolve_path(d["root"], base),
                                 resolve_path(cache_root, base) if cache_root else None)
        log.info("dataset.class_names read from %s: [%s] (%d classes)", d["root"],
                 ", ".join(names), len(names))
        if not _unset(node, "num_classes") and node.num_classes != len(names):
            raise ConfigError(f"dataset.num_classes={node.num_classes} but the data names "
                              f"{len(names)} classes {names} (dataset.class_names read from "
                              f"{d['root']}); leave dataset.num_classes out or make it agree")
        node.class_names = names
    if _unset(node, "num_classes") and not _unset(node, "class_names"):
        node.num_classes = len(node.class_names)
