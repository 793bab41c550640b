"""What Hydra composes, kept per process, so each compose does not read, parse and merge the same
YAML files again.

A ``python run.py`` composes two to four times (Hydra's mode probe, the run, each stage's record;
a tool or a sweep more), a test process hundreds of times, mostly from the same files with the
same group choices. A compose of conf/ took 0.32 s CPU on 2 cores; with what is kept here and the
copy below not made, 0.04 s. Three things are kept:

- **Parsed files** (about a quarter of a compose): a file under its real path, modification
  time, size and inode; Hydra gets a deep copy each time, as if it had parsed the file itself.
  Configs in installed packages (``pkg://``, Hydra's own) are kept by name.
- **Defaults lists** (Hydra's tree of which config of each group, about two fifths): kept under
  the primary config name, the group overrides (choices, appends, deletions; not the value
  overrides, which Hydra applies after the merge), the search path and Hydra's version base,
  with what building the list left in Hydra's ``Overrides`` (the choices it saw, the overrides
  it used), put back on a hit. Hydra's mode probe composes with ``skip_missing`` (a '???' group
  default is left out instead of refused); its list serves the run too unless it left one out.
- **Merged defaults lists** (the configs of a list merged with their schemas, about two fifths):
  kept under the list itself and the search path.

And one copy is not made: Hydra copies its config repository on every compose (deeply, so that
processing ``hydra.searchpath`` does not change the original's list of sources), and with it the
whole ConfigStore that its structured source points at (every schema: 25 ms a compose). The copy
now points at ConfigStore itself, the one store of the process, as the original does; nothing
writes to the store through a source.

A kept defaults list or merge is used only while every file source of the search path is as it
was (each file's and folder's modification time, size and inode: an edit, a file added that
shadows another, one removed) and nothing was stored in ConfigStore since (a counter of
``ConfigStore.store`` calls; structured configs are not otherwise looked at). A hit hands Hydra a
deep copy (~0.02 s). Everything else (parsing the overrides, applying the value overrides, the
hydra node) is Hydra's own work on every compose.

It wraps ``load_config`` of the classes Hydra registered for ``file://`` and ``pkg://`` once its
plugin scan has run (the scan re-imports those modules, so wrapping earlier would be undone),
``_create_defaults_list`` and ``_check_not_missing`` of ``hydra._internal.defaults_list``,
``ConfigLoaderImpl._compose_config_from_defaults_list`` and ``ConfigStore.store``, and gives the
``structured://`` source class a ``__deepcopy__``. Where Hydra's internals are not as expected
(another Hydra version), nothing is wrapped: composing works as before, only slower.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import threading
from collections import OrderedDict
from typing import Any, Callable

try:  # Hydra's internals as of 1.3; where they differ, nothing is wrapped
    from hydra import version as hydra_version
    from hydra._internal import defaults_list as hydra_defaults
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins
except ImportError:  # pragma: no cover - another Hydra version
    ConfigLoaderImpl = ConfigStore = SourcesRegistry = Plugins = None  # type: ignore[assignment,misc]
    hydra_version = hydra_defaults = None  # type: ignore[assignment]

_WRAPPED = "_mdk_wrapped"  # on what cache_composition has wrapped
_parsed: dict[tuple, Any] = {}  # key -> Hydra's ConfigResult, never handed out itself
# defaults list, search path -> (state of the config folders, ConfigStore generation, merged config)
_merged: "OrderedDict[tuple, tuple[tuple, int, Any]]" = OrderedDict()
# primary config, group choices, search path -> (state, generation, a '???' skipped, the result)
_trees: "OrderedDict[tuple, tuple[tuple, int, bool, Any]]" = OrderedDict()
KEPT = 32  # of each kind per process (a merged config ~0.5 MB); the least recently used goes
FOLDER_ENTRIES = 2000  # a file source with more files and folders than this is not kept
_store = {"generation": 0}  # ConfigStore.store calls so far
_skips = threading.local()  # .n: group defaults this thread left out as '???' (the mode probe)
# A sweep's launcher threads compose beside its main thread: one at a time in the kept dicts.
_lock = threading.Lock()
# What building a defaults list changes in Hydra's Overrides (the rest is the value overrides)
_OVERRIDES_STATE = ("override_choices", "override_metadata", "append_group_defaults",
                    "known_choices", "known_choices_per_group", "deletions")


def cache_composition() -> None:
    """Wrap what the module docstring names (once each; cheap to call again)."""
    if SourcesRegistry is None or Plugins is None or ConfigLoaderImpl is None:
        return
    try:
        Plugins.instance()  # the plugin scan: it re-imports the source classes before we wrap
        registry = SourcesRegistry.instance()
        classes = {scheme: registry.resolve(scheme) for scheme in ("file", "pkg")}
        structured = registry.resolve("structured")
        merge = ConfigLoaderImpl._compose_config_from_defaults_list
        store = ConfigStore.store
        tree, check_missing = hydra_defaults._create_defaults_list, hydra_defaults._check_not_missing
    except Exception:  # noqa: BLE001 - an optimisation: without it Hydra composes as it does
        return
    for scheme, cls in classes.items():
        if not getattr(cls, _WRAPPED, False) and callable(getattr(cls, "load_config", None)):
            cls.load_config = _cached(cls.load_config, _file_key if scheme == "file" else _pkg_key)
            setattr(cls, _WRAPPED, True)
    if not getattr(merge, _WRAPPED, False):
        ConfigLoaderImpl._compose_config_from_defaults_list = _cached_merge(merge)
    if not getattr(store, _WRAPPED, False):
        ConfigStore.store = _counted_store(store)
    if not getattr(tree, _WRAPPED, False):
        hydra_defaults._create_defaults_list = _cached_tree(tree)
    if not getattr(check_missing, _WRAPPED, False):
        hydra_defaults._check_not_missing = _counted_skips(check_missing)
    if not getattr(structured, _WRAPPED, False) and "__deepcopy__" not in vars(structured):
        structured.__deepcopy__ = _copy_sharing_store
        setattr(structured, _WRAPPED, True)


def _copy_sharing_store(self: Any, memo: dict) -> Any:
    """A structured source's deep copy that points at the same ConfigStore."""
    new = type(self).__new__(type(self))
    memo[id(self)] = new
    for name, value in vars(self).items():
        setattr(new, name, value if name == "store" else copy.deepcopy(value, memo))
    return new


def _file_key(source: Any, config_path: str) -> tuple | None:
    try:
        name = source._normalize_file_name(config_path)
        path = os.path.realpath(os.path.join(source.path, name))
        st = os.stat(path)
    except (OSError, AttributeError, TypeError):  # missing: Hydra's own error, from Hydra
        return None
    return ("file", path, st.st_mtime_ns, st.st_size, st.st_ino)


def _pkg_key(source: Any, config_path: str) -> tuple | None:
    return ("pkg", getattr(source, "path", None), config_path)


def _cached(load: Callable, key_of: Callable[[Any, str], tuple | None]) -> Callable:
    def load_config(self: Any, config_path: str) -> Any:
        key = key_of(self, config_path)
        if key is None:
            return load(self, config_path)
        key = (*key, self.provider)
        result = _parsed.get(key)
        if result is None:
            result = _parsed[key] = load(self, config_path)
        return dataclasses.replace(result, config=copy.deepcopy(result.config),
                                   header=dict(result.header))

    return load_config


def _counted_store(store: Callable) -> Callable:
    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        _store["generation"] += 1  # before: a merge kept while it stores is not trusted either
        store(self, *args, **kwargs)

    setattr(counted, _WRAPPED, True)
    return counted


def _folder_state(path: str, out: list) -> bool:
    """Every file and folder under ``path`` into ``out``: modification time, size and inode (a
    folder's time changes when a file in it is added, removed or renamed). False: too many."""
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
            out.append((folder, st.st_mtime_ns, st.st_ino))
            with os.scandir(folder) as entries:
                for e in entries:
                    if e.is_dir():
                        stack.append(e.path)
                    else:
                        st = e.stat()
                        out.append((e.path, st.st_mtime_ns, st.st_size, st.st_ino))
        except FileNotFoundError:
            out.append((folder, None))
        if len(out) > FOLDER_ENTRIES:
            return False
    return True


def _sources(repo: Any) -> tuple:
    return tuple((s.scheme(), s.path, s.provider) for s in repo.get_sources())


def _sources_state(repo: Any) -> tuple | None:
    """The state of every file source of ``repo`` (None: one cannot be read, or is too big to look
    at on each compose; pkg:// sources are installed packages, ConfigStore has its generation).
    Read once per compose: Hydra's repository is one compose's (its defaults list, its merge)."""
    if not hasattr(repo, "_mdk_sources_state"):
        repo._mdk_sources_state = _read_sources_state(repo)
    return repo._mdk_sources_state


def _read_sources_state(repo: Any) -> tuple | None:
    out: list = []
    try:
        for source in repo.get_sources():
            if source.scheme() == "file" and not _folder_state(source.path, out):
                return None
    except (OSError, AttributeError, TypeError):
        return None
    return tuple(sorted(out, key=repr))


def _frozen(value: Any) -> Any:
    """``value`` (Hydra's overrides and defaults: dicts, lists, sets, dataclasses) as a key."""
    if dataclasses.is_dataclass(value):
        return (type(value).__name__,
                *((f.name, _frozen(getattr(value, f.name))) for f in dataclasses.fields(value)))
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(v) for v in value))
    return value


def _keep(kept: OrderedDict, key: tuple, entry: tuple) -> None:
    with _lock:
        kept[key] = entry
        while len(kept) > KEPT:
            kept.popitem(last=False)


def _kept(kept: OrderedDict, key: tuple, state: tuple) -> Any:
    """The entry under ``key`` (now the most recently used) when it was kept with the config
    files in ``state`` and nothing was stored in ConfigStore since; else None."""
    with _lock:
        entry = kept.get(key)
        if entry is None or entry[:2] != (state, _store["generation"]):
            return None
        kept.move_to_end(key)
        return entry


def _counted_skips(check_missing: Callable) -> Callable:
    def check_not_missing(*args: Any, **kwargs: Any) -> bool:
        skipped = check_missing(*args, **kwargs)
        _skips.n = getattr(_skips, "n", 0) + bool(skipped)
        return skipped

    setattr(check_not_missing, _WRAPPED, True)
    return check_not_missing


def _lookup(kept: OrderedDict, repo: Any, make_key: Callable[[], tuple]) -> tuple | None:
    """(key, the folders' state, ConfigStore generation, kept entry or None) under ``make_key()``;
    None when Hydra's objects are not as expected or a source cannot be looked at (Hydra then
    works alone). The generation is read first: a store during Hydra's work is not trusted."""
    try:
        key, state = make_key(), _sources_state(repo)
    except Exception:  # noqa: BLE001 - not as expected: Hydra works as it does
        return None
    if state is None:
        return None
    return key, state, _store["generation"], _kept(kept, key, state)


def _cached_tree(create: Callable) -> Callable:
    """Hydra's defaults list of ``config_name`` under the group overrides, kept. Its mode probe
    (``skip_missing``: a '???' group default is left out) and the run then share one list, unless
    the probe did leave one out."""
    def create_defaults_list(repo: Any, config_name: Any, overrides: Any, prepend_hydra: bool,
                             skip_missing: bool) -> Any:
        found = _lookup(_trees, repo, lambda: (
            config_name, prepend_hydra, str(hydra_version.getbase()), _sources(repo),
            *(_frozen(getattr(overrides, name)) for name in _OVERRIDES_STATE)))
        if found is None:
            return create(repo, config_name, overrides, prepend_hydra, skip_missing)
        key, state, generation, hit = found
        if hit is not None and (skip_missing or not hit[2]):
            defaults, tree, after = copy.deepcopy(hit[3])
            for name, value in zip(_OVERRIDES_STATE, after):
                setattr(overrides, name, value)  # as building the list left them
            return defaults, tree
        skips = getattr(_skips, "n", 0)
        defaults, tree = create(repo, config_name, overrides, prepend_hydra, skip_missing)
        after = tuple(getattr(overrides, name) for name in _OVERRIDES_STATE)
        _keep(_trees, key, (state, generation, getattr(_skips, "n", 0) != skips,
                            copy.deepcopy((defaults, tree, after))))
        return defaults, tree

    setattr(create_defaults_list, _WRAPPED, True)
    return create_defaults_list


def _cached_merge(merge: Callable) -> Callable:
    """Hydra's merge of the configs of a defaults list, kept."""
    def compose_config_from_defaults_list(self: Any, defaults: list, repo: Any) -> Any:
        found = _lookup(_merged, repo, lambda: (_frozen(defaults), _sources(repo)))
        if found is None:
            return merge(self, defaults, repo)
        key, state, generation, hit = found
        if hit is not None:
            return copy.deepcopy(hit[2])
        cfg = merge(self, defaults, repo)
        _keep(_merged, key, (state, generation, copy.deepcopy(cfg)))
        return cfg

    setattr(compose_config_from_defaults_list, _WRAPPED, True)
    return compose_config_from_defaults_list
