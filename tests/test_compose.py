"""mdk/compose.py on Hydra's public compose API: every compose reads the config files as they are
now and gets its own config; a running app's ``hydra.searchpath`` additions are seen by composes
and by the group options (a stage declared outside conf/)."""
from __future__ import annotations

from pathlib import Path

from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton

from mdk.compose import CONF_DIR, compose, group_options, running_app


def _conf(root: Path, lr: str) -> Path:
    (root / "optim").mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text("defaults:\n  - optim: sgd\n  - _self_\nname: mine\n")
    (root / "optim" / "sgd.yaml").write_text(f"lr: {lr}\n")
    return root / "optim" / "sgd.yaml"


def test_an_edited_file_is_read_by_the_next_compose(tmp_path):
    f = _conf(tmp_path, "0.100")
    assert compose([], config_dir=tmp_path).optim.lr == 0.1
    f.write_text("lr: 0.300\n")
    assert compose([], config_dir=tmp_path).optim.lr == 0.3


def test_each_compose_gets_its_own_config(tmp_path):
    _conf(tmp_path, "0.5")
    first = compose(["optim.lr=0.7"], config_dir=tmp_path)
    first.optim.lr = 9.0
    first.name = "changed"
    again = compose([], config_dir=tmp_path)
    assert again.optim.lr == 0.5 and again.name == "mine"


def test_a_file_added_where_it_shadows_another_is_read(tmp_path):
    """The primary config folder comes before hydra.searchpath: a file added there wins."""
    main, extra = tmp_path / "main", tmp_path / "extra"
    main.mkdir()
    (extra / "optim").mkdir(parents=True)
    (main / "config.yaml").write_text("defaults:\n  - optim: sgd\n  - _self_\n")
    (extra / "optim" / "sgd.yaml").write_text("lr: 0.1\n")
    over = [f"hydra.searchpath=[file://{extra}]"]
    assert compose(over, config_dir=main).optim.lr == 0.1
    (main / "optim").mkdir()
    (main / "optim" / "sgd.yaml").write_text("lr: 0.2\n")
    assert compose(over, config_dir=main).optim.lr == 0.2
    (main / "optim" / "sgd.yaml").unlink()
    assert compose(over, config_dir=main).optim.lr == 0.1


def test_a_config_stored_again_under_the_same_name_is_read(tmp_path):
    (tmp_path / "config.yaml").write_text("defaults:\n  - stored_again_test\n  - _self_\n")
    cs = ConfigStore.instance()
    cs.store(name="stored_again_test", node={"lr": 0.1})
    assert compose([], config_dir=tmp_path).lr == 0.1
    cs.store(name="stored_again_test", node={"lr": 0.3})
    assert compose([], config_dir=tmp_path).lr == 0.3


def test_inside_a_running_app_its_searchpath_adds_group_options_and_configs(tmp_path):
    """As in ``python run.py hydra.searchpath=[file://extra] step=polish``: the app's Hydra
    config (set through Hydra's public HydraConfig, as Hydra's job runner does) names the extra
    folder; group_options and compose see its stage, and outside the app neither does."""
    extra = tmp_path / "extra"
    (extra / "step").mkdir(parents=True)
    (extra / "step" / "polish.yaml").write_text(
        (CONF_DIR / "step" / "step1.yaml").read_text().replace("name: step1", "name: polish"))
    state = Singleton.get_state()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            app = compose([f"hydra.searchpath=[file://{extra}]", "debug=tiny"], hydra_config=True)
            HydraConfig.instance().set_config(app)
            assert running_app() == ([f"file://{extra}"], "config")
            assert "polish" in group_options("step") and "step1" in group_options("step")
            assert compose(["step=polish"]).step.name == "polish"
    finally:
        Singleton.set_state(state)
    assert not HydraConfig.initialized() and "polish" not in group_options("step")
