"""Parsed config files kept per process, so each Hydra compose does not read and parse every YAML
file again.

A ``python run.py`` composes two to four times (Hydra's mode probe, the run, each stage's record;
a tool or a sweep more), each time loading the same files, and parsing YAML into OmegaConf is
about a quarter of a compose (conf/ on 2 cores: 0.30 -> 0.22 s CPU per compose with this). A file
is kept under its real path, modification time and size (an edited file is read again); Hydra gets
a deep copy each time, as if it had parsed the file itself. Configs in installed packages
(``pkg://``, Hydra's own) are kept by name. Structured configs (ConfigStore) are not cached.

It wraps ``load_config`` of the classes Hydra registered for ``file://`` and ``pkg://`` once its
plugin scan has run (the scan re-imports those modules, so wrapping earlier would be undone). Where
Hydra's internals are not as expected (another Hydra version), nothing is wrapped: composing
works as before, only slower.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Callable

try:  # Hydra's internals as of 1.3; where they differ, nothing is wrapped
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins
except ImportError:  # pragma: no cover - another Hydra version
    SourcesRegistry = Plugins = None  # type: ignore[assignment,misc]

_WRAPPED = "_mdk_cached_load_config"
_parsed: dict[tuple, Any] = {}  # key -> Hydra's ConfigResult, never handed out itself


def cache_config_files() -> None:
    """Wrap Hydra's file and package config sources (once per class; cheap to call again)."""
    if SourcesRegistry is None or Plugins is None:
        return
    try:
        Plugins.instance()  # the plugin scan: it re-imports the source classes before we wrap
        registry = SourcesRegistry.instance()
        classes = {scheme: registry.resolve(scheme) for scheme in ("file", "pkg")}
    except Exception:  # noqa: BLE001 - an optimisation: without it Hydra composes as it does
        return
    for scheme, cls in classes.items():
        if not getattr(cls, _WRAPPED, False) and callable(getattr(cls, "load_config", None)):
            cls.load_config = _cached(cls.load_config, _file_key if scheme == "file" else _pkg_key)
            setattr(cls, _WRAPPED, True)


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
