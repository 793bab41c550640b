"""An ultralytics/YOLO ``data.yaml``: where it is, its class names and its splits, read as
ultralytics reads them (conf/dataset/yolo.yaml says the layout). The file comes from elsewhere (an
annotation tool, a download): it is read with PyYAML's safe loader, so a ``!!python/...`` tag is
refused and nothing in it runs; its ``download:`` key is ignored (nothing is fetched at run time).
Anything wrong is a one-line :class:`~mdk.errors.DataError` naming the file (and line).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from mdk.errors import DataError

log = logging.getLogger(__name__)

YAML_NAMES = ("data.yaml", "data.yml")
_SAID: set[tuple[str, str]] = set()   # (file, what) said once per process


def say_once(path: Path, what: str, message: str, *args: Any) -> None:
    """Log ``message`` once per process for ``(path, what)`` (a reader is built several times)."""
    if (str(path), what) not in _SAID:
        _SAID.add((str(path), what))
        log.warning(message, *args)


def find_yaml(root: Path) -> Path:
    """``root`` itself when it is a file, else its ``data.yaml`` (or its only ``*.yaml``)."""
    if root.is_file():
        return root
    if not root.is_dir():
        raise DataError(f"dataset.root={str(root)!r} does not exist; point dataset.root at the "
                        "folder holding data.yaml (or at the yaml file itself)")
    for name in YAML_NAMES:
        if (root / name).is_file():
            return root / name
    found = sorted(p for p in root.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if len(found) == 1:
        return found[0]
    hint = (" (Label Studio's YOLO export writes classes.txt: its lines are the names, in order)"
            if (root / "classes.txt").is_file() else "")
    have = f"found {[p.name for p in found]}; name one as dataset.root" if found else "found none"
    raise DataError(f"{root}: no data.yaml ({have}); write one with train: and val: (image "
                    f"folders or .txt lists) and names: [...]{hint}")


def load_yaml(path: Path) -> dict:
    """The yaml as a mapping, read with the safe loader."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read it ({exc}); fix the file or point dataset.root "
                        "at another") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        tag = str(exc.problem).split("tag ")[-1].strip("'").replace("tag:yaml.org,2002:", "!!")
        raise DataError(f"{path}:{line}: tag {tag} is not allowed: mdk reads data.yaml with a "
                        "safe loader and runs nothing from it; remove the tag (plain values "
                        "only)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DataError(f"{path}{where}: not valid YAML ({what}); fix the file") from None
    if not isinstance(doc, dict):
        raise DataError(f"{path}: holds {type(doc).__name__}, not a mapping; a data.yaml has "
                        "keys train:, val: and names: (is this a YOLO data.yaml?)")
    if "download" in doc:
        say_once(path, "download", "%s: its download: key is ignored: mdk fetches nothing at run "
                 "time (the data must already be in place)", path)
    return doc


def class_names_of(doc: dict, path: Path) -> list[str]:
    """``names`` (a list, or a mapping of ids 0..n-1 to names) or ``nc`` alone (``class_<i>``);
    both given must agree."""
    names, nc = doc.get("names"), doc.get("nc")
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int) or nc < 1):
        raise DataError(f"{path}: nc={nc!r} must be a whole number >= 1 (the number of classes)")
    if names is None:
        if nc is None:
            raise DataError(f"{path}: no names: and no nc:; list the classes as names: [a, b, "
                            "...] in label id order")
        return [f"class_{i}" for i in range(nc)]
    if isinstance(names, dict):
        ids = []
        for key in names:
            try:
                ids.append(int(key))
            except (TypeError, ValueError):
                raise DataError(f"{path}: names has the key {key!r}, not a class id; write "
                                "names as id: name (0: person) or as a list") from None
        if sorted(ids) != list(range(len(ids))):
            raise DataError(f"{path}: names has the ids {sorted(ids)}, not 0..{len(ids) - 1}; "
                            "number the classes from 0 without gaps (and their labels with them)")
        names = [names[k] for k in sorted(names, key=int)]
    elif not isinstance(names, list) or not names:
        raise DataError(f"{path}: names={names!r} must be a list of class names or a mapping "
                        "id: name")
    names = [str(n) for n in names]
    if nc is not None and nc != len(names):
        raise DataError(f"{path}: nc: {nc} but names lists {len(names)} classes; make them "
                        "agree (or remove nc:)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DataError(f"{path}: names lists {twice} more than once; each class once")
    return names


def base_folder(doc: dict, path: Path) -> Path:
    """The folder the splits are relative to: ``path:`` (relative to the yaml's folder), else the
    yaml's folder. A ``path:`` that is no folder here (ultralytics resolves it against its own
    datasets folder) falls back to the yaml's folder, said once."""
    here = path.parent.resolve()
    given = doc.get("path")
    if given in (None, ""):
        return here
    base = (here / str(given)).resolve()
    if base.is_dir():
        return base
    say_once(path, "path", "%s: path: %r is not a folder here; the splits are read relative to "
             "the yaml's folder %s", path, given, here)
    return here


def split_sources(doc: dict, path: Path, split: str) -> list[Path]:
    """The folders and .txt lists of ``split`` (a key of the yaml), resolved as ultralytics does:
    relative to :func:`base_folder`; a missing ``../x`` is read as ``x`` (Roboflow writes
    ``train: ../train/images`` in a yaml beside ``train/``)."""
    keys = [k for k in doc if doc[k] not in (None, "") and k in ("train", "val", "test", "minival")]
    if split not in doc or doc[split] in (None, ""):
        raise DataError(f"{path}: no {split}: key; set dataset.train_split/val_split to keys it "
                        f"has (found: {keys})")
    entries = doc[split] if isinstance(doc[split], list) else [doc[split]]
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise DataError(f"{path}: {split}: {doc[split]!r} must be a folder or a .txt list of "
                        "images, or a list of them")
    base = base_folder(doc, path)
    out = []
    for entry in entries:
        where = (base / entry).resolve()
        if not where.exists() and entry.startswith("../"):
            where = (base / entry[3:]).resolve()
        if not where.exists():
            raise DataError(f"{path}: {split}: {entry!r} is {where}, which does not exist; fix "
                            f"the path (relative to {base}) or add the folder")
        out.append(where)
    return out
