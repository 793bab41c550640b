"""mdk/compose_cache.py: each config file is parsed, and each defaults list merged, once per process
while what they read is unchanged; every compose still gets its own config, and an edited, added or
stored config is seen by the next compose."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf

from mdk import compose_cache
from mdk.compose import CONF_DIR, compose
from mdk.compose_cache import cache_composition


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
    a = OmegaConf.to_container(compose(["debug=tiny"]), resolve=False)
    b = OmegaConf.to_container(compose(["debug=tiny"]), resolve=False)
    assert a == b and a["dataset"]["generate"]["num_train"] == 48


def test_the_shipped_conf_composes_the_same_as_with_nothing_kept(monkeypatch):
    """A kept defaults list and merge give what Hydra builds itself (the hydra node too: the
    choices, the overrides), under other value overrides (each test's paths, a learning rate);
    no list or merge is added for those, and another group choice gets its own."""
    def nothing_kept() -> None:
        for kind in ("_trees", "_merged"):
            monkeypatch.setattr(compose_cache, kind, type(compose_cache._merged)())

    def kept_count() -> tuple[int, int]:
        return len(compose_cache._trees), len(compose_cache._merged)

    nothing_kept()
    group = ["model=gnetdet_224", "head=anchors"]
    compose([*group, "paths.data=/x", "optim.lr=0.5"])
    over = [*group, "paths.data=/y", "optim.lr=0.25"]
    kept = OmegaConf.to_container(compose(over, hydra_config=True), resolve=False)
    assert kept_count() == (1, 1)  # both reused
    other = compose([*group[:1], "head=yolov1", "paths.data=/y"])
    assert other.head._target_.endswith("YoloV1Head") and kept_count() == (2, 2)
    nothing_kept()  # so what follows is Hydra's own work
    fresh = OmegaConf.to_container(compose(over, hydra_config=True), resolve=False)
    assert kept_count() == (1, 1)
    assert kept == fresh and fresh["paths"]["data"] == "/y" and fresh["optim"]["lr"] == 0.25
    assert fresh["model"]["image_size"] == 224
    assert fresh["hydra"]["runtime"]["choices"]["head"] == "anchors"


def test_the_mode_probes_list_does_not_hide_a_missing_group_choice(tmp_path):
    """Hydra's mode probe leaves a '???' group default out; the run that follows must still
    refuse it (a list kept by the probe is not the run's), and take it once it is given."""
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "a.yaml").write_text("host: a\n")
    (tmp_path / "config.yaml").write_text("defaults:\n  - db: ???\n  - _self_\n")
    cache_composition()
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        probe = loader.load_configuration("config", [], run_mode=RunMode.MULTIRUN)
        assert "db" not in probe
        with pytest.raises(ConfigCompositionException, match="You must specify 'db'"):
            hydra_compose("config")
        assert hydra_compose("config", overrides=["db=a"]).db.host == "a"


def test_a_file_added_where_it_shadows_the_kept_one_is_read(tmp_path):
    """The merge of the same defaults list is not reused when a file it could be read from appears
    in an earlier search path entry (here: the primary config folder before hydra.searchpath)."""
    main, extra = tmp_path / "main", tmp_path / "extra"
    (main).mkdir()
    (extra / "optim").mkdir(parents=True)
    (main / "config.yaml").write_text("defaults:\n  - optim: sgd\n  - _self_\n")
    (extra / "optim" / "sgd.yaml").write_text("lr: 0.1\n")
    over = [f"hydra.searchpath=[file://{extra}]"]
    assert compose(over, config_dir=main).optim.lr == 0.1
    assert compose(over, config_dir=main).optim.lr == 0.1  # kept
    (main / "optim").mkdir()
    (main / "optim" / "sgd.yaml").write_text("lr: 0.2\n")
    assert compose(over, config_dir=main).optim.lr == 0.2
    (main / "optim" / "sgd.yaml").unlink()
    assert compose(over, config_dir=main).optim.lr == 0.1


def test_a_config_stored_again_under_the_same_name_is_read(tmp_path):
    (tmp_path / "config.yaml").write_text("defaults:\n  - cached_store_test\n  - _self_\n")
    cs = ConfigStore.instance()
    cs.store(name="cached_store_test", node={"lr": 0.1})
    assert compose([], config_dir=tmp_path).lr == 0.1
    cs.store(name="cached_store_test", node={"lr": 0.3})
    assert compose([], config_dir=tmp_path).lr == 0.3


def test_hydras_copy_of_its_config_repository_points_at_the_one_config_store():
    """Hydra deep-copies its repository on every compose; the copy's structured source reads
    ConfigStore itself (no copy of every schema), and the original's sources stay its own."""
    compose(["debug=tiny"])  # the wrapping is in place
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        repo = GlobalHydra.instance().config_loader().repository
        again = copy.deepcopy(repo)
    assert again.sources is not repo.sources and again.sources[-1] is not repo.sources[-1]
    assert again.sources[-1].store is repo.sources[-1].store is ConfigStore.instance()
