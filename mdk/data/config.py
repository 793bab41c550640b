"""The ``dataset`` config group (conf/dataset/*.yaml): its schema, word lists and :func:`check`.
Imported before torch: the standard library, omegaconf and mdk.errors only.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, List, Mapping, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from mdk.errors import ConfigError, DataError

# dataset.augment_on (auto: the training device with CUDA, else the loader: mdk/engine/train.py).
AUGMENT_ON = ("auto", "loader", "device")
# dataset.on_bad_image: what an image that does not decode does (mdk/data/image_check.py).
POLICIES = ("error", "skip")
VOC_READER = "mdk.data.voc.VOCReader"   # the reader of a null dataset.reader
REQUIRED = ("name", "root", "train_split", "val_split")


@dataclass
class AugmentConf:
    """``dataset.augmentation`` (mdk/data/augment.py). Mild defaults: the chip's 5-bit input
    already removes detail."""

    flip: float = 0.5              # probability of a horizontal flip
    vflip: float = 0.0             # of a vertical flip (microscopy, aerial: no up or down)
    affine: float = 0.5            # of the scale/shift
    scale: List[float] = field(default_factory=lambda: [0.8, 1.2])  # zoom range
    shift: float = 0.1             # translation range, a fraction of the side
    jitter: float = 0.2            # brightness, contrast, saturation x 1 +- jitter
    min_visible: float = 0.4       # an object less inside the image than this is dropped
    # An epoch of a resolution schedule below the model's size (trainer.image_sizes) scales
    # scale/shift/jitter by its share of the final size to this power (0: the same strengths;
    # 1: proportional; EfficientNetV2's progressive learning: small images, mild augmentation).
    size_power: float = 0.0

    def at_size(self, size: int, final: int) -> "AugmentConf":
        """These strengths for an epoch at ``size`` of a stage that ends at ``final``."""
        if size >= final or self.size_power == 0:
            return self
        f = (size / final) ** self.size_power
        lo, hi = self.scale
        return replace(self, scale=[1 - (1 - lo) * f, 1 + (hi - 1) * f], shift=self.shift * f,
                       jitter=self.jitter * f)


@dataclass
class DatasetConf:
    """The keys of a conf/dataset/*.yaml (values of one format's reader are its own node)."""

    name: str = MISSING                  # labels the dataset's folders (meta files, checkpoints)
    root: str = MISSING                  # '???' in a YAML: the user must pass dataset.root=...
    # Label order; annotations are matched by name. null: read from the data when the run starts
    # (mdk/data/class_names.py: VOC's sorted names, COCO's categories by id, YOLO's names).
    class_names: Optional[List[str]] = None
    num_classes: Optional[int] = None    # null: len(class_names); else it must equal it
    train_split: str = "train"
    val_split: str = "val"
    reader: Any = None                   # {_target_: reader class, its own keys}; null: VOC layout
    generate: Optional[Any] = None       # {_target_: a function(root=, class_names=, ...)} or null
    augment: bool = True
    augmentation: AugmentConf = field(default_factory=AugmentConf)
    augment_on: str = "auto"             # one of AUGMENT_ON
    cache_images: bool = False
    num_workers: Any = 0                 # an integer >= 0 or "auto"
    meta_dir: Optional[str] = None       # null: <paths.data>/meta/<name>-<hash of root>/
    on_bad_image: str = "error"          # one of POLICIES


SCHEMAS: dict[str, type] = {"dataset": DatasetConf}


def plain(cfg: Mapping[str, Any] | DictConfig) -> dict:
    """The node as a plain dict, resolved (a missing root: one line saying what to pass)."""
    if isinstance(cfg, DictConfig):
        if OmegaConf.is_missing(cfg, "root"):
            target = OmegaConf.select(cfg, "reader._target_", default=None)
            if target in (None, VOC_READER):
                raise DataError("dataset.root is not set; pass dataset.root=/path/to/VOCdevkit/"
                                "VOC2007 (the folder holding JPEGImages/, Annotations/, "
                                "ImageSets/Main/)")
            raise DataError(f"dataset.root is not set; pass dataset.root=/path/to/the/data (the "
                            f"folder conf/dataset/{cfg.get('name')}.yaml describes)")
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def check(cfg_dataset: Mapping[str, Any] | DictConfig) -> dict:
    """Check the ``dataset`` node; return it as a plain dict. Errors name the bad key."""
    d = plain(cfg_dataset)
    for key in REQUIRED:
        if d.get(key) in (None, "???"):
            raise DataError(f"dataset.{key} is not set; see conf/dataset/{d.get('name', 'shapes')}.yaml")
    gen = d.get("generate")
    if gen is not None and not (isinstance(gen, dict) and gen.get("_target_")):
        raise DataError(f"dataset.generate={gen!r} must be null or a node with a _target_ (a "
                        "function called with root= and class_names= that makes the data)")
    names = d.get("class_names")
    if names is None:  # filled from the data before the checks (mdk.data.class_names)
        raise DataError(f"dataset.class_names is not set and was not read from the data; set "
                        f"dataset.class_names=[...] (see conf/dataset/{d.get('name')}.yaml)")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise DataError(f"dataset.class_names={names!r} must be a non-empty list of strings")
    if len(set(names)) != len(names):
        raise DataError(f"dataset.class_names={names} has duplicates; each class once")
    # a config slip, not a file's: a config error
    if d.get("num_classes") is not None and d["num_classes"] != len(names):
        raise ConfigError(f"dataset.num_classes={d['num_classes']} but dataset.class_names has "
                          f"{len(names)} names; make them agree")
    reader = d.get("reader")
    if reader is not None and not (isinstance(reader, dict) and reader.get("_target_")):
        raise DataError(f"dataset.reader={reader!r} must be null or a node with a _target_ (the "
                        "reader class of the dataset's format, e.g. mdk.data.voc.VOCReader)")
    check_augmentation(d.get("augmentation") or {})
    if d.get("augment_on", "auto") not in AUGMENT_ON:
        raise DataError(f"dataset.augment_on={d['augment_on']!r} must be auto, loader or device")
    nw = d.get("num_workers", 0)
    if nw != "auto" and (isinstance(nw, bool) or not isinstance(nw, int) or nw < 0):
        raise DataError(f"dataset.num_workers={nw!r} must be an integer >= 0 or auto")
    check_bad_image_policy(d.get("on_bad_image", "error"))
    return d


def check_dataset(cfg: DictConfig) -> None:
    """The config checks' entry for the ``dataset`` node."""
    check(cfg.dataset)


def check_augmentation(a: Mapping[str, Any]) -> None:
    def num(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, float))

    for key in ("flip", "vflip", "affine", "min_visible", "shift", "jitter"):
        v, top = a.get(key, 0.0), ")" if key in ("shift", "jitter") else "]"  # [0, 1) or [0, 1]
        if not num(v) or not 0 <= v <= 1 or (v == 1 and top == ")"):
            raise ConfigError(f"dataset.augmentation.{key}={v!r} must be a number in [0, 1{top}")
    power = a.get("size_power", 0.0)
    if not num(power) or not 0 <= power <= 4:
        raise ConfigError(f"dataset.augmentation.size_power={power!r} must be a number in [0, 4] "
                          "(0: the same strengths at every size of trainer.image_sizes)")
    scale = a.get("scale", [1.0, 1.0])
    if (not isinstance(scale, (list, tuple)) or len(scale) != 2 or not all(num(v) for v in scale)
            or not 0 < scale[0] <= scale[1]):
        raise ConfigError(f"dataset.augmentation.scale={scale!r} must be [low, high] with "
                          "0 < low <= high, e.g. [0.8, 1.2]")


def check_bad_image_policy(policy: Any) -> None:
    if policy not in POLICIES:
        raise DataError(f"dataset.on_bad_image={policy!r} must be one of {list(POLICIES)} "
                        "(error: stop naming the file; skip: leave bad images out of the index "
                        "and list them in the log)")
