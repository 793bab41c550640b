"""Writing a generated dataset in VOC layout, whole or not at all (:mod:`mdk.data.staging`).

A generator gives ``render(i, image_size, seed, class_names) -> (image, [(class name, [x1, y1,
x2, y2])])``; the first ``num_train`` images form ``train``, the next ``num_val`` ``val``
(with ``val_first``, the val images are fixed generator indices: ``render_index``).
``manifest.json`` records the parameters; a change of any of them regenerates the folder (only a
folder a generator made).
"""
from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, Sequence

from PIL import Image

from mdk.data.staging import remove_leftovers, replace, staged
from mdk.errors import DataError, disk_error, disk_reason

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# Disk use per image, for the free-space check: its JPEG (under 0.5 bytes per pixel at quality 92)
# and its XML, each rounded up to a 4 KiB block.
BYTES_PER_PIXEL, BLOCK = 0.5, 4096
MAX_WORKERS, MIN_PER_WORKER = 8, 100  # processes drawing images; fewer images: this one alone
Objects = list[tuple[str, list[int]]]
Render = Callable[[int, int, int, list[str]], tuple[Image.Image, Objects]]


def voc_xml(filename: str, image_size: int, objects: Objects, folder: str = "shapes") -> bytes:
    ann = ET.Element("annotation")
    ET.SubElement(ann, "folder").text = folder
    ET.SubElement(ann, "filename").text = filename
    size = ET.SubElement(ann, "size")
    for tag, value in (("width", image_size), ("height", image_size), ("depth", 3)):
        ET.SubElement(size, tag).text = str(value)
    ET.SubElement(ann, "segmented").text = "0"
    for name, box in objects:
        obj = ET.SubElement(ann, "object")
        ET.SubElement(obj, "name").text = name
        ET.SubElement(obj, "pose").text = "Unspecified"
        ET.SubElement(obj, "truncated").text = "0"
        ET.SubElement(obj, "difficult").text = "0"
        bb = ET.SubElement(obj, "bndbox")
        for tag, v in zip(("xmin", "ymin", "xmax", "ymax"), box):
            ET.SubElement(bb, tag).text = str(v)
    ET.indent(ann)
    return ET.tostring(ann, encoding="utf-8")


def write_voc(out: Path, params: dict, render: Render, folder: str = "shapes") -> None:
    """Every image of ``params`` (num_train, num_val, image_size) into ``out``, then the manifest;
    the images are drawn by up to one process per core (each from its own seed: the same bytes)."""
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    n_train, n_val = params["num_train"], params["num_val"]
    ids = [f"{i:06d}" for i in range(n_train + n_val)]
    workers = max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)), len(ids) // MIN_PER_WORKER))
    parts = [list(range(k, len(ids), workers)) for k in range(workers)]
    if workers > 1:  # fork: the render function and its module need no pickling by name
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            for done in [pool.submit(_write_images, out, params, render, folder, part)
                         for part in parts]:
                done.result()  # a worker's error (a full disk) is raised here
    else:
        _write_images(out, params, render, folder, parts[0])
    (out / "ImageSets/Main/train.txt").write_text("".join(f"{i}\n" for i in ids[:n_train]))
    (out / "ImageSets/Main/val.txt").write_text("".join(f"{i}\n" for i in ids[n_train:]))
    (out / MANIFEST).write_text(json.dumps(params, indent=1, sort_keys=True))


def _write_images(out: Path, params: dict, render: Render, folder: str, which: list[int]) -> None:
    n_train, n_val = params["num_train"], params["num_val"]
    for i in which:
        image_id = f"{i:06d}"
        img, objects = render(render_index(i, n_train, n_val, params.get("val_first")),
                              params["image_size"], params["seed"], params["class_names"])
        img.save(out / "JPEGImages" / f"{image_id}.jpg", quality=92)
        (out / "Annotations" / f"{image_id}.xml").write_bytes(
            voc_xml(f"{image_id}.jpg", params["image_size"], objects, folder))


def render_index(i: int, n_train: int, n_val: int, val_first: int | None) -> int:
    """The generator index of the dataset's ``i``-th image (train first, then val). With
    ``val_first`` the val images are the generator's ``val_first..`` and the train images skip
    over them: a train split of another size keeps the same val images."""
    if val_first is None:
        return i
    if i >= n_train:
        return val_first + i - n_train
    return i if i < val_first else i + n_val


def manifest(version: int, num_train: int, num_val: int, image_size: int, seed: int,
             class_names: Sequence[str], val_first: int | None = None, **extra: str) -> dict:
    """The parameters ``manifest.json`` records (``extra``: a generator's own, e.g. its name)."""
    out = {**extra, "version": version, "num_train": int(num_train), "num_val": int(num_val),
           "image_size": int(image_size), "seed": int(seed), "class_names": list(class_names)}
    if val_first is not None:  # absent otherwise: the folders made before it stay valid
        out["val_first"] = int(val_first)
    return out


def read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def bytes_for(params: dict, root: str | Path | None = None) -> int:
    """About how many bytes the images of ``params`` take; 0 when ``root`` holds them already."""
    if root is not None and read_manifest(Path(root).expanduser()) == params:
        return 0
    per_image = math.ceil(BYTES_PER_PIXEL * int(params["image_size"]) ** 2 / BLOCK) * BLOCK + BLOCK
    return (int(params["num_train"]) + int(params["num_val"])) * per_image


def ensure_generated(root: Path, params: dict, generate: Callable[[Path, dict], None],
                     name: str) -> Path:
    """Make sure ``root`` holds the dataset ``generate(out, params)`` writes; return ``root``.
    Any other non-empty folder is refused (never delete user data); ``name`` labels messages."""
    remove_leftovers(root, f"the {name} dataset")
    old = read_manifest(root)
    if old == params:
        return root
    if root.exists() and old is None and any(root.iterdir()):
        raise DataError(f"dataset.root={str(root)!r} exists, is not empty and is not a generated "
                        f"{name} dataset (no manifest.json); choose an empty or new folder")
    start = time.perf_counter()
    log.info("generating the %s dataset (%d train + %d val, %dpx) in %s", name,
             params["num_train"], params["num_val"], params["image_size"], root)
    try:
        with staged(root) as tmp:
            generate(tmp, params)
            if read_manifest(root) != params:        # else another process finished first
                try:
                    replace(tmp, root)
                except OSError:
                    if read_manifest(root) != params:  # lost a race to a different generation
                        raise
    except OSError as e:
        if disk_reason(e) is None:
            raise
        need = bytes_for(params)
        raise disk_error(e, e.filename or root.parent, f"the {name} dataset is generated there "
                         f"(about {need / 2**20:.1f} MB)", "paths.data") from None
    log.info("%s dataset ready in %.1f s", name, time.perf_counter() - start)
    return root


def check_request(generator: str, class_names: Sequence[str], known: Sequence[str],
                  num_train: int, num_val: int, image_size: int) -> None:
    """A DataError for a request a generator cannot draw."""
    unknown = [n for n in class_names if n not in known]
    if unknown or not class_names:
        raise DataError(f"dataset.class_names={list(class_names)}: the {generator} generator "
                        f"draws only {list(known)}; use a non-empty subset of those")
    if num_train < 1 or num_val < 1 or image_size < 32:
        raise DataError(f"{generator} dataset: num_train={num_train}, num_val={num_val} must be "
                        f">= 1 and image_size={image_size} >= 32")
