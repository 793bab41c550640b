"""First use of a YOLO folder vs the same images as a VOC folder: the index (reading every
annotation into records: the YOLO reader also reads each image's size from its header) and the
image check (decoding every image once), as a run's first start does them.

    python benchmarks/bench_yolo_index.py --images 20000            # VOC scale
    python benchmarks/bench_yolo_index.py --smoke

N images (``--images``) of VOC's size (500x375 JPEGs: ``--distinct`` different pictures,
hard-linked under N names, so generating them is cheap and both layouts decode the same bytes)
with 1-4 random boxes each, written as a VOC folder (``Annotations/<id>.xml``, one split list) and
a YOLO folder (``images/train/``, ``labels/train/<id>.txt``, data.yaml). Each first use runs in a
fresh subprocess with an empty cache folder (its peak RSS is the process's high-water mark),
VOC and YOLO alternating (ABBA) over ``--reps``; every file is read once before, so both run from
the page cache. Prints each one's median wall time (index, image check) and peak memory, and
YOLO / VOC. Goal: <= 1.2x the time and no more memory.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CLASSES = ["circle", "square", "triangle", "star", "cross"]
W, H = 500, 375


def make_folders(out: Path, n: int, distinct: int, seed: int = 0) -> tuple[Path, Path]:
    """The VOC and the YOLO folder of the same ``n`` images (made once; reused when present)."""
    import numpy as np
    from PIL import Image, ImageDraw

    voc, yolo = out / "voc", out / "yolo"
    done = out / f"done-{n}-{distinct}"
    if done.is_file():
        return voc, yolo
    rng = np.random.default_rng(seed)
    for d in (voc / "JPEGImages", voc / "Annotations", voc / "ImageSets/Main",
              yolo / "images/train", yolo / "labels/train", out / "pictures"):
        d.mkdir(parents=True, exist_ok=True)
    pictures = []
    for k in range(distinct):   # smooth backgrounds and a few shapes: JPEGs of a photo's size
        ramp = np.linspace(0, 1, W)[None, :, None] * rng.uniform(40, 200, 3)
        img = Image.fromarray((ramp + np.linspace(0, 60, H)[:, None, None]).clip(0, 255)
                              .astype(np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(6):
            x, y = int(rng.integers(0, W - 60)), int(rng.integers(0, H - 60))
            draw.ellipse([x, y, x + int(rng.integers(20, 60)), y + int(rng.integers(20, 60))],
                         fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
        pictures.append(out / "pictures" / f"{k}.jpg")
        img.save(pictures[-1], quality=90)
    ids = [f"{i:06d}" for i in range(n)]
    for i, image_id in enumerate(ids):
        for dst in (voc / "JPEGImages" / f"{image_id}.jpg", yolo / "images/train" / f"{image_id}.jpg"):
            if not dst.exists():
                os.link(pictures[i % distinct], dst)
        xml, lines = [], []
        for _ in range(int(rng.integers(1, 5))):
            x1, y1 = int(rng.integers(0, W - 40)), int(rng.integers(0, H - 40))
            x2, y2 = int(rng.integers(x1 + 10, W)), int(rng.integers(y1 + 10, H))
            c = int(rng.integers(len(CLASSES)))
            xml.append(f"<object><name>{CLASSES[c]}</name><pose>Unspecified</pose><truncated>0"
                       f"</truncated><difficult>0</difficult><bndbox><xmin>{x1}</xmin><ymin>{y1}"
                       f"</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>")
            lines.append(f"{c} {(x1 + x2) / 2 / W!r} {(y1 + y2) / 2 / H!r} {(x2 - x1) / W!r} "
                         f"{(y2 - y1) / H!r}")
        (voc / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><folder>VOC2007</folder><filename>{image_id}.jpg</filename><source>"
            "<database>generated</database></source><size><width>500</width><height>375</height>"
            f"<depth>3</depth></size><segmented>0</segmented>{''.join(xml)}</annotation>\n")
        (yolo / "labels/train" / f"{image_id}.txt").write_text("\n".join(lines) + "\n")
    (voc / "ImageSets/Main/train.txt").write_text("\n".join(ids) + "\n")
    (yolo / "data.yaml").write_text(f"train: images/train\nval: images/train\nnames: {CLASSES}\n")
    done.write_text("")
    return voc, yolo


def first_use(kind: str, root: Path, cache: Path) -> dict:
    """In this (fresh) process: the index and the image check of ``root``'s train split."""
    from mdk.data.image_check import check_images
    from mdk.data.index import cached_records
    from mdk.data.voc import VOCReader
    from mdk.data.yolo import YOLOReader

    t0 = time.perf_counter()
    reader = VOCReader(root, CLASSES) if kind == "voc" else YOLOReader(root, CLASSES)
    records = cached_records(reader, "train", cache)
    t1 = time.perf_counter()
    bad = check_images(root, [r.image for r in records], cache / "train.images.json",
                       progress=False)
    t2 = time.perf_counter()
    assert not bad and len(records) > 0
    return {"index": t1 - t0, "check": t2 - t1, "total": t2 - t0, "images": len(records),
            "objects": int(sum(len(r.labels) for r in records)),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(kind: str, root: Path, cache: Path) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", kind, "--root", str(root),
                        "--cache", str(cache)], capture_output=True, text=True,
                       env=dict(os.environ, MDK_NO_BOOTSTRAP="1"))
    if p.returncode != 0:
        raise SystemExit(f"{kind} first use failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--distinct", type=int, default=64, help="different pictures among them")
    ap.add_argument("--reps", type=int, default=2, help="first uses of each layout (ABBA)")
    ap.add_argument("--dir", default=None, help="where the folders go (default: a temp folder)")
    ap.add_argument("--child", choices=["voc", "yolo"], help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    common.add_smoke_flag(ap)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(first_use(a.child, Path(a.root), Path(a.cache))))
        return
    if a.smoke:
        a.images, a.distinct, a.reps = 40, 4, 1
    out = Path(a.dir) if a.dir else common.smoke_dir()
    print(common.machine())
    t0 = time.perf_counter()
    voc, yolo = make_folders(out, a.images, a.distinct)
    print(f"{a.images} images ({a.distinct} distinct pictures of {W}x{H}) as VOC and YOLO "
          f"folders under {out}: {time.perf_counter() - t0:.1f} s")
    for folder in (voc, yolo):   # into the page cache, so neither pays the first disk read
        for p in folder.rglob("*"):
            if p.is_file():
                p.read_bytes()
    got: dict[str, list[dict]] = {"voc": [], "yolo": []}
    for r in range(a.reps):
        for kind in (("voc", "yolo") if r % 2 == 0 else ("yolo", "voc")):
            cache = out / f"cache-{kind}-{r}"
            got[kind].append(run_child(kind, voc if kind == "voc" else yolo, cache))
    med = {k: {f: common.median([x[f] for x in v]) for f in ("index", "check", "total", "peak_mb")}
           for k, v in got.items()}
    assert got["voc"][0]["objects"] == got["yolo"][0]["objects"]
    for kind in ("voc", "yolo"):
        m = med[kind]
        print(f"{kind.upper():<4} first use of {a.images} images: {m['total']:.2f} s (index "
              f"{m['index']:.2f} s, image check {m['check']:.2f} s), peak RSS {m['peak_mb']:.0f} MB"
              f"  [{common.load()}]")
    print(f"YOLO / VOC: time {med['yolo']['total'] / med['voc']['total']:.2f}x, index "
          f"{med['yolo']['index'] / med['voc']['index']:.2f}x, peak memory "
          f"{med['yolo']['peak_mb'] / med['voc']['peak_mb']:.2f}x (goal: <= 1.2x, <= 1.0x)")


if __name__ == "__main__":
    main()
