"""Training hooks named by config (``trainer.hooks``, mdk/engine/extra_hooks.py): built with the
stage's facts and their options, a null node is off, and a bad node is one config error line
naming its key (docs/errors.md #106). A hook that ends training early: the search's trial
reporter, tested through real runs in test_hparams_search.py."""
from __future__ import annotations

import pytest

from mdk.engine.extra_hooks import build_extra_hooks
from mdk.engine.loop import HookBase
from mdk.errors import ConfigError


class Counting(HookBase):
    def __init__(self, *, stage, run_dir, is_main, so_far, every: int = 1) -> None:
        self.stage, self.run_dir, self.is_main, self.so_far, self.every = stage, run_dir, is_main, so_far, every


def _build(nodes, tmp_path):
    return build_extra_hooks(nodes, stage="step1", run_dir=tmp_path, is_main=True,
                             so_far=lambda: {"best_map50": 0.25})


def test_named_hooks_are_built_with_the_stage_and_their_options(tmp_path):
    [hook] = _build({"count": {"_target_": "test_extra_hooks.Counting", "every": 2}, "off": None}, tmp_path)
    assert isinstance(hook, Counting) and (hook.stage, hook.run_dir, hook.is_main, hook.every) == \
        ("step1", tmp_path, True, 2)
    assert hook.so_far() == {"best_map50": 0.25}
    assert _build({}, tmp_path) == [] and _build(None, tmp_path) == []


@pytest.mark.parametrize("nodes, line", [
    ([1], r"^trainer.hooks=\[1\] must be a map of hook nodes \(each with a _target_\); \{\} for none$"),
    ({"c": {"every": 2}}, r"^trainer.hooks.c=\{'every': 2\} needs a _target_ \(the hook class\), e.g. "
                         r"trainer.hooks.c._target_=pkg.module.MyHook$"),
    ({"c": {"_target_": "nowhere.Nothing"}}, r"^trainer.hooks.c._target_='nowhere.Nothing' cannot be imported"),
    ({"c": {"_target_": "test_extra_hooks.Counting", "bogus": 1}},
     r"^trainer.hooks.c: test_extra_hooks.Counting does not take these keys \(got an unexpected "
     r"keyword argument 'bogus'\); set only the keys it takes \(see its docstring\)$"),
    ({"c": {"_target_": "collections.OrderedDict"}},
     r"^trainer.hooks.c._target_=collections.OrderedDict is not a training hook \(mdk.engine.loop.HookBase\)$"),
])
def test_a_bad_hook_node_is_one_line_naming_its_key(nodes, line, tmp_path):
    with pytest.raises(ConfigError, match=line):
        _build(nodes, tmp_path)
