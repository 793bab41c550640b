"""The dataset group's owner (mdk.data.config): the typed schema fits every conf/dataset YAML,
rejects a wrong type, and the module stays importable before torch."""
from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from conftest import REPO, run_cmd_env
from mdk.data.config import AUGMENT_ON, POLICIES, DatasetConf, check
from mdk.errors import DataError

YAMLS = sorted((REPO / "conf" / "dataset").glob("*.yaml"))


@pytest.mark.parametrize("path", YAMLS, ids=[p.stem for p in YAMLS])
def test_every_dataset_yaml_fits_the_schema(path):
    own = OmegaConf.load(path)
    assert list(own.defaults) == ["/_schema_dataset_dataset@_here_", "_self_"]
    del own["defaults"]
    merged = OmegaConf.merge(OmegaConf.structured(DatasetConf), own)
    assert set(merged) == set(DatasetConf.__dataclass_fields__)   # no key missing, none extra
    if merged.class_names is None:   # read from the data (mdk.data.class_names)
        assert merged.num_classes is None
    else:
        assert merged.num_classes == len(merged.class_names)
    assert merged.reader._target_.startswith("mdk.data.")
    assert merged.augment_on in AUGMENT_ON and merged.on_bad_image in POLICIES


def test_the_schema_rejects_a_wrong_type_naming_the_key():
    with pytest.raises(ValidationError, match="num_classes"):
        OmegaConf.merge(OmegaConf.structured(DatasetConf), {"num_classes": "five"})


@pytest.mark.parametrize("over, match", [
    ({"augment_on": "gpu"}, r"^dataset.augment_on='gpu' must be auto, loader or device$"),
    ({"num_workers": -1}, r"^dataset.num_workers=-1 must be an integer >= 0 or auto$"),
    ({"on_bad_image": "ignore"}, r"^dataset.on_bad_image='ignore' must be one of \['error', "),
    ({"val_split": None}, r"^dataset.val_split is not set; see conf/dataset/coco.yaml$"),
])
def test_check_names_the_key(over, match):
    d = {**OmegaConf.to_container(OmegaConf.load(REPO / "conf/dataset/coco.yaml")), "root": "/x"}
    del d["defaults"]
    with pytest.raises(DataError, match=r"^dataset.class_names is not set and was not read from "
                       r"the data; set dataset.class_names=\[...\] \(see conf/dataset/coco.yaml\)$"):
        check(d)   # a list left out is filled from the data before the checks
    d["class_names"] = ["a", "b"]
    assert check(d)["name"] == "coco"
    with pytest.raises(DataError, match=match):
        check({**d, **over})


def fresh() -> dict:
    """A fresh interpreter (not one forked from the suite's warm server, tests/helpers/warm.py):
    these tests count what an import loads."""
    return dict(run_cmd_env(), MDK_TEST_COLD="1")


def test_imported_before_torch():
    code = ("import sys, mdk.data.config; "
            "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'hydra', 'PIL')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=fresh(),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_schema_loads_before_torch():
    """The schema registry (every group's schema, from each owner) loads before Hydra composes,
    as run.py does: importing it must not import torch (``python run.py --help`` stays fast)."""
    code = ("import sys, mdk.schema; "
            "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'PIL')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=fresh(),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
