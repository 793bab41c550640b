"""A key the config does not have: the line says what was probably meant (``trainer.epoch=3``:
"did you mean trainer.epochs?"), and a ``+key`` nothing reads is refused, so a typo is never
followed by a run that ignores it (docs/errors.md).

Closed nodes take only the keys they declare: a typed group's node (its schema's fields: trainer,
optim, dist, model, dataset, ...) and the root config's own nodes (the root, ``eval``,
``objective``, ``export``). Open nodes take new keys, as designed: ``stages`` (each stage's
changes, checked against its record by mdk.stage), a map a schema declares (``trainer.hooks``,
``logger.sinks``), a ``_target_`` node (a reader's or a sink's own keys: the class built from it
takes them) and everything below one of these. Hydra's own node is Hydra's.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Any, Iterator, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from mdk.errors import ConfigError
from mdk.schema import SCHEMAS

OPEN_ROOT = ("stages",)  # the root config's maps (conf/config.yaml)
HYDRA = "hydra"
_ABSENT = object()  # a key not in the config
CUTOFF = 0.6  # difflib's similarity above which a declared key is what was probably meant


def _is_map(tp: Any) -> bool:
    """``dict[...]`` (or Optional of one) as a schema declares a field."""
    if typing.get_origin(tp) is typing.Union:
        return any(_is_map(a) for a in typing.get_args(tp) if a is not type(None))
    return tp is dict or typing.get_origin(tp) is dict


def _dataclass_of(tp: Any) -> Optional[type]:
    if typing.get_origin(tp) is typing.Union:
        return next(filter(None, (_dataclass_of(a) for a in typing.get_args(tp))), None)
    return tp if dataclasses.is_dataclass(tp) else None


def _maps(cls: type, path: str) -> Iterator[str]:
    for name, tp in typing.get_type_hints(cls).items():
        if name not in {f.name for f in dataclasses.fields(cls)}:
            continue
        if _is_map(tp):
            yield f"{path}.{name}"
        elif _dataclass_of(tp) is not None:
            yield from _maps(_dataclass_of(tp), f"{path}.{name}")


@functools.lru_cache(maxsize=1)
def schema_maps() -> frozenset[str]:
    """The paths of the maps the typed groups declare (``trainer.hooks``, ``logger.sinks``)."""
    return frozenset(p for group, schemas in SCHEMAS.items() for cls in schemas.values()
                     for p in _maps(cls, group))


def declared_keys(node: DictConfig) -> Optional[list[str]]:
    """The keys a typed node's schema declares; None for an untyped node."""
    tp = OmegaConf.get_type(node)
    return [f.name for f in dataclasses.fields(tp)] if dataclasses.is_dataclass(tp) else None


def is_open(path: str, node: Any = None, root: Optional[DictConfig] = None) -> bool:
    """Whether the node at ``path`` (given, or found in ``root``) takes new keys by design."""
    parts = path.split(".") if path else []
    if parts and parts[0] in (*OPEN_ROOT, HYDRA):
        return True
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in schema_maps():
            return True
        above = node if i == len(parts) else (
            OmegaConf.select(root, prefix, default=None) if root is not None else None)
        if isinstance(above, DictConfig) and "_target_" in above.keys():
            return True
    return False


def suggestion(path: str, key: str, known: Sequence[str]) -> str:
    """``did you mean <path>.<closest key>?`` (difflib), or where to see the keys."""
    match = difflib.get_close_matches(key, [k for k in known if k != key], n=1, cutoff=CUTOFF)
    if match:
        return f"did you mean {path + '.' if path else ''}{match[0]}?"
    return f"its keys: python run.py --cfg job{' --package ' + path if path else ''}"


def unknown_key_line(path: str, key: str, override: str, known: Sequence[str],
                     added: bool = False) -> str:
    """``trainer.epoch=3: trainer has no key 'epoch'; did you mean trainer.epochs?``"""
    new = " and nothing reads a new one" if added else ""
    return f"{override}: {path or 'the config'} has no key '{key}'{new}; " \
           f"{suggestion(path, key, known)}"


def not_in_struct_line(cause: BaseException, override: str) -> Optional[str]:
    """The line for Hydra's "Could not override" of a key a node lacks: what was probably meant.
    None where Hydra's advice to add it with ``+`` stands: a map, ``stages``, and a ``_target_``
    node with no key close to the one typed (its class may take a new one)."""
    parent, key, full_key = (getattr(cause, name, None) for name in
                             ("parent_node", "key", "full_key"))
    if not isinstance(parent, DictConfig) or not isinstance(key, str) or not full_key:
        return None
    full = str(full_key)
    if full != key and not full.endswith("." + key):
        return None
    path = full[:-len(key) - 1] if full != key else ""
    known = declared_keys(parent) or [str(k) for k in parent.keys()]
    if is_open(path, parent) and ("_target_" not in parent.keys()
                                  or not difflib.get_close_matches(key, known, 1, CUTOFF)):
        return None
    return unknown_key_line(path, key, override, known)


def _task(cfg: DictConfig) -> tuple[list[str], set[str]]:
    """This run's command-line overrides and its config group choices: from the config's own
    ``hydra`` node (a sweep job's, checked before it starts) or the running app's."""
    if HYDRA in cfg.keys():
        hydra = cfg[HYDRA]
    elif HydraConfig.initialized():
        hydra = HydraConfig.get()
    else:
        return [], set()
    return [str(o) for o in hydra.overrides.task], {str(k) for k in hydra.runtime.choices.keys()}


def _select(cfg: DictConfig, path: str) -> Any:
    return OmegaConf.select(cfg, path, default=_ABSENT, throw_on_resolution_failure=False)


def _was_there(path: str, node: Any, added: "Added") -> bool:
    """Whether the node at ``path`` was in the config before the ``+`` overrides put there what
    it holds."""
    if node is _ABSENT or path in added.keys:
        return False
    return not isinstance(node, DictConfig) or len(node) == 0 or any(
        f"{path}.{k}" not in added.paths for k in node.keys())


@dataclasses.dataclass(frozen=True)
class Added:
    """What the ``+`` overrides added: their keys, and those with every key above them."""
    keys: frozenset[str]
    paths: frozenset[str]


def _check_added(cfg: DictConfig, override: Any, added: Added) -> None:
    """Refuse the ``+key=value`` ``override`` unless an open node or a declared key takes it."""
    node, path = cfg, ""
    for key in override.key_or_group.split("."):
        child_path = f"{path}.{key}" if path else key
        child = _select(cfg, child_path)
        if is_open(child_path, child, cfg):
            return
        declared = declared_keys(node)
        if not (key in declared if declared is not None else _was_there(child_path, child, added)):
            known = declared if declared is not None else [
                str(k) for k in node.keys() if _was_there(f"{path}.{k}" if path else str(k),
                                                          _select(node, str(k)), added)]
            raise ConfigError(unknown_key_line(path, key, override.input_line, known, True))
        if not isinstance(child, DictConfig):
            return
        node, path = child, child_path


def _typed_extras(node: DictConfig, path: str) -> Iterator[tuple[str, str, list[str]]]:
    """(path, key, declared keys) of each key a typed node holds but does not declare."""
    declared = declared_keys(node)
    for key, value in node.items_ex(resolve=False):
        child_path = f"{path}.{key}" if path else str(key)
        if declared is not None and key not in declared and not is_open(path, node):
            yield path, str(key), declared
        if isinstance(value, DictConfig) and not OmegaConf.is_interpolation(node, key) \
                and node.get(key) is not None and child_path != HYDRA \
                and not is_open(child_path, value):
            yield from _typed_extras(value, child_path)


def check_added_keys(cfg: DictConfig, overrides: Optional[Sequence[str]] = None) -> None:
    """Refuse a key added to a closed node (``+trainer.epoch=3``) in one line naming it and what
    was probably meant. ``overrides``: the command's (default: this run's, when known)."""
    groups: set[str] = set()
    if overrides is None:
        overrides, groups = _task(cfg)
    parsed = [o for o in OverridesParser.create().parse_overrides(list(overrides)) if o.is_add()]
    values = [o for o in parsed if o.package is None and "/" not in o.key_or_group
              and o.key_or_group not in groups and o.key_or_group.split(".")[0] != HYDRA
              and _select(cfg, o.key_or_group) is not _ABSENT]
    keys = [o.key_or_group.split(".") for o in values]
    added = Added(frozenset(".".join(k) for k in keys),
                  frozenset(".".join(k[:i + 1]) for k in keys for i in range(len(k))))
    for override in values:
        _check_added(cfg, override, added)
    for path, key, declared in _typed_extras(cfg, ""):
        raise ConfigError(unknown_key_line(path, key, f"{path}.{key}", declared, True))
