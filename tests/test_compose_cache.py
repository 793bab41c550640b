"""mdk/compose_cache.py: each config file is parsed once per process while it is unchanged, and
every compose still gets its own config."""
from __future__ import annotations

import os
from pathlib import Path

from mdk.compose import compose


def _conf(root: Path, lr: str) -> Path:
    (root / "optim").mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text("defaults:\n  - optim: sgd\n  - _self_\nname: cached\n")
    (root / "optim" / "sgd.yaml").write_text(f"lr: {lr}\n")
    return root / "optim" / "sgd.yaml"


def test_an_edited_file_is_read_again_and_an_unchanged_one_is_not(tmp_path):
    f = _conf(tmp_path, "0.100")
    assert compose([], config_dir=tmp_path).optim.lr == 0.1
    st = f.stat()
    # Same length, modification time and inode put back: the kept parse is what compose sees.
    with open(f, "r+") as fh:
        fh.write("lr: 0.200\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert compose([], config_dir=tmp_path).optim.lr == 0.1
    # An edit as an editor makes it (a new modification time): read again.
    f.write_text("lr: 0.300\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))  # coarse clocks too
    assert compose([], config_dir=tmp_path).optim.lr == 0.3


def test_each_compose_gets_its_own_config(tmp_path):
    _conf(tmp_path, "0.5")
    first = compose(["optim.lr=0.7"], config_dir=tmp_path)
    first.optim.lr = 9.0
    first.name = "changed"
    again = compose([], config_dir=tmp_path)
    assert again.optim.lr == 0.5 and again.name == "cached"


def test_the_shipped_conf_composes_the_same_with_the_files_kept():
    from omegaconf import OmegaConf

    a = OmegaConf.to_container(compose(["debug=tiny"]), resolve=False)
    b = OmegaConf.to_container(compose(["debug=tiny"]), resolve=False)
    assert a == b and a["dataset"]["generate"]["num_train"] == 48
