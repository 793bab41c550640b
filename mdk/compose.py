"""The one owner of config composition: the real ``conf/`` composed with Hydra.

Inside a running Hydra app (a run, a sweep or submitit job) it uses that app's search path, so
``hydra.searchpath`` additions are seen; elsewhere it composes this repository's ``conf/``.
"""
from __future__ import annotations

import re
import shlex
from contextlib import contextmanager
from itertools import takewhile
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from mdk.config_keys import not_in_struct_line
from mdk.errors import ConfigError
from mdk.paths import register_resolvers
from mdk.schema import register_schemas

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
CONFIG_NAME = "config"


def running_app() -> tuple[list[str], Optional[str]]:
    """The running Hydra app's search path and primary config name ([], None outside one)."""
    if HydraConfig.initialized():
        hc = HydraConfig.get()
        return [str(p) for p in hc.searchpath], hc.job.config_name
    return [], None


@contextmanager
def _hydra_context(config_dir: Optional[Path] = None) -> Iterator[None]:
    """Hydra's global state for the compose API: the running app's, or ``config_dir``."""
    register_resolvers()
    register_schemas()
    other = config_dir is not None and Path(config_dir).resolve() != CONF_DIR
    if GlobalHydra.instance().is_initialized() and not other:
        yield
        return
    if other and GlobalHydra.instance().is_initialized():
        raise RuntimeError(f"cannot compose {config_dir} inside a running Hydra app")
    with initialize_config_dir(config_dir=str(config_dir or CONF_DIR), version_base="1.3"):
        yield


_APP_DEFAULT = object()


def compose(overrides: Sequence[str] = (), config_name: Any = _APP_DEFAULT,
            config_dir: Optional[Path] = None, hydra_config: bool = False) -> DictConfig:
    """``conf/`` (or ``config_dir``) composed with ``overrides``; Hydra's errors become a one-line
    ConfigError naming the key. ``config_name=None`` composes groups without a primary config;
    ``hydra_config=True`` keeps the ``hydra`` node."""
    over = list(overrides)
    sp, app_config = running_app()
    if config_name is _APP_DEFAULT:
        config_name = app_config or CONFIG_NAME
    if sp and not any(o.split("=", 1)[0].lstrip("+~") == "hydra.searchpath" for o in over):
        over.append("hydra.searchpath=[" + ",".join(sp) + "]")
    with _hydra_context(config_dir):
        try:
            return hydra_compose(config_name, overrides=over, return_hydra_config=hydra_config)
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(one_line(e)) from None


def group_options(group: str) -> list[str]:
    """The options of a config group (e.g. ``step``: every declared stage), sorted."""
    searchpath, _ = running_app()
    # The app's loader lists conf/ only: its hydra.searchpath additions apply per composition,
    # so they are given again here, as compose() does.
    over = ["hydra.searchpath=[" + ",".join(searchpath) + "]"] if searchpath else []
    with _hydra_context():
        loader = GlobalHydra.instance().config_loader()
        return sorted(loader.get_group_options(group, overrides=over))


_TYPE_WORDS = {"Integer": "an integer", "Boolean": "true or false", "Float": "a number"}


def _explain_cause(cause: BaseException) -> str:
    """One line for an OmegaConf error, in the words validate uses, typed group or not."""
    full_key = getattr(cause, "full_key", None)
    first = str(cause).strip().splitlines()[0].strip() if str(cause).strip() else ""
    if full_key and "could not be converted to" in first:
        word = first.rsplit(" ", 1)[-1]
        value = getattr(cause, "value", None)
        example = f" (e.g. {full_key}=1)" if word == "Integer" else ""
        return f"{full_key}={value!r} must be {_TYPE_WORDS.get(word, word)}{example}"
    if full_key and "is not a valid bool" in first:
        return f"{full_key}={getattr(cause, 'value', None)!r} must be true or false"
    key = getattr(cause, "key", None)
    if key is not None and (" not in '" in first or "not in struct" in first):
        return f"Key '{key}' is not in struct"
    return first


# What Hydra's override grammar takes unquoted in a value (besides ${...}, lists and dicts).
_UNQUOTED = "ASCII letters, digits, spaces and _-+./:@$%*?|"


def _bad_position(e: OverrideParseException) -> Optional[int]:
    """Where in the override Hydra's parser stopped (None when its message does not say)."""
    text, lines = e.override, (e.message or "").splitlines()
    if len(lines) > 1 and lines[0].endswith(text) and lines[1].strip() == "^":
        i = lines[1].index("^") - (len(lines[0]) - len(text))
        return i if 0 <= i < len(text) else None
    token = re.search(r"input '(.+?)' expecting", e.message or "")
    if token and token.group(1) != "<EOF>":
        i = text.find(token.group(1), text.find("=") + 1)
        return i if i >= 0 else None
    return None


def _quoted(key: str, value: str) -> str:
    """``key="value"`` as typed in a shell: Hydra's quotes inside the shell's."""
    q = "'" if '"' in value and "'" not in value else '"'
    body = value.replace(q, "\\" + q)
    body += "\\" * (len(body) - len(body.rstrip("\\")))  # before the closing quote: doubled
    return shlex.quote(f"{key}={q}{body}{q}")


def grammar_error(e: OverrideParseException) -> str:
    """One line for an override Hydra cannot parse: where it stopped, and how to write it."""
    text = e.override
    where = _bad_position(e)
    at = f" (at {text[where]!r})" if where is not None else ""
    head = f"could not parse the override {text}{at}"
    key, eq, value = text.partition("=")
    if not eq:
        return f"{head}: write key=value, e.g. trainer.epochs=3"
    if where is not None and where < len(key):
        return (f"{head}: a key is a dotted name of ASCII letters, digits, _ and -, "
                "e.g. trainer.epochs=3")
    if value.lstrip().startswith(("[", "{")):
        return (f"{head}: a list is written [a,b] and a dict {{a:1,b:2}}; quote an item with "
                f"characters other than {_UNQUOTED}, e.g. {key}='[\"a b\",c]'")
    return (f"{head}: a value with characters other than {_UNQUOTED} must be quoted, "
            f"e.g. {_quoted(key, value)}")


def one_line(e: BaseException) -> str:
    """A multi-line Hydra/OmegaConf message as one line: the key, the value, what to do."""
    if isinstance(e, OverrideParseException) and e.override:
        return grammar_error(e)
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    head = lines[0].rstrip(".") if lines else type(e).__name__
    cause = e.__cause__ or (e if getattr(e, "full_key", None) else None)
    append = [ln for ln in lines[1:] if ln.lower().startswith("to append to your config use +")]
    if cause is not None and append and head.startswith("Could not override"):
        typo = not_in_struct_line(cause, append[0].split(" use +", 1)[1])
        if typo:  # a closed node: what was probably meant, not Hydra's advice to add the key
            return typo
    if cause is not None:
        why = _explain_cause(cause)
        if head.startswith("Error merging override") and "must be" in why:
            return why  # the override is in `why` already (key=value)
        if why and why not in head:
            head = why if cause is e else f"{head}: {why}"
    for i, ln in enumerate(lines[1:], 1):
        if ln.lower().startswith("available options"):
            opts = takewhile(lambda o: not o.lower().startswith("config search path"),
                             lines[i + 1:])
            return f"{head}; {ln.rstrip(':')}: {', '.join(opts)}"
        if ln.lower().startswith("to append"):
            return f"{head} ({ln[0].lower() + ln[1:]})"
    return head

