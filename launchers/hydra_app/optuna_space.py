"""A search's space: ``hydra.sweeper.params`` and the command line's sweeps in Hydra's override
grammar, as Optuna distributions, and a trial's parameters back as overrides (the forms:
docs/cluster.md, "Searches", ``params``; ``range`` takes floats too). A list or dict choice is
carried as its override text (Optuna's choices are scalars). Optuna is imported only when a
space is built: Hydra imports the sweeper plugin at every start.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (ChoiceSweep, IntervalSweep, Override, QuotedString,
                                              RangeSweep)
from hydra.errors import HydraException

from mdk.errors import ConfigError


@dataclass
class SearchSpace:
    """``distributions``: by parameter name (the key without +/~); ``keys``: the key as written
    in an override; ``texts``: a non-scalar choice's override text; ``fixed``: overrides every
    trial gets."""

    distributions: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    texts: dict[str, dict[Any, str]] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        out = list(self.fixed)
        for name, value in params.items():
            text = self.texts.get(name, {}).get(value)
            out.append(f"{self.keys[name]}={text if text is not None else value_text(value)}")
        return out

    def choices(self) -> dict[str, list[Any]]:
        """The categorical parameters' values (a grid sampler's search space)."""
        return {n: list(d.choices) for n, d in self.distributions.items()
                if type(d).__name__ == "CategoricalDistribution"}


_PARSER = OverridesParser.create()
RANGES = ("write a range as choice(a,b), a,b, range(1,10,2), interval(0.001,0.1) or "
          "tag(log, interval(0.0001,0.1))")


def value_text(value: Any) -> str:
    """``value`` (a scalar, or a list, dict or quoted string of a parsed override) as override
    text that Hydra reads back to the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, QuotedString):
        return value.with_quotes()
    if isinstance(value, list):
        return "[" + ",".join(map(value_text, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{value_text(v)}" for k, v in value.items()) + "}"
    for text in (value, "'" + value.replace("'", "\\'") + "'"):
        with contextlib.suppress(HydraException):  # text that does not parse: try the next
            if _PARSER.parse_override(f"k={text}").value() == value:
                return text
    raise ConfigError(f"the value {value!r} cannot be written as a Hydra override")


def _distribution(o: Override, where: str) -> tuple[Any, dict[Any, str]]:
    """Optuna's distribution for a sweep override, and the texts of non-scalar choices."""
    import optuna.distributions as od  # optuna: only when a search builds its space (see top)

    v = o.value()
    log = "log" in v.tags
    if isinstance(v, ChoiceSweep):
        if log:
            raise ConfigError(f"{where}: tag(log, ...) needs an interval or an integer range")
        if "int" in v.tags:
            raise ConfigError(f"{where}: tag(int, ...) needs an interval")
        values, texts = [], {}
        for item in v.list:
            if isinstance(item, QuotedString):
                item = item.text
            elif isinstance(item, (list, dict)):  # Optuna's choices are scalars: carry the text
                item = value_text(item)
                texts[item] = item
            values.append(item)
        return od.CategoricalDistribution(values), texts
    if isinstance(v, RangeSweep):
        start, stop, step = v.start, v.stop, v.step
        last = list(v.range())
        if not last:
            raise ConfigError(f"{where}: range({start}, {stop}, {step}) is empty")
        if all(isinstance(x, int) for x in (start, stop, step)):
            if log and step != 1:
                raise ConfigError(f"{where}: tag(log, range(...)) needs step 1")
            return od.IntDistribution(int(start), int(last[-1]), log=log,
                                      step=1 if log else int(step)), {}
        if log:
            raise ConfigError(f"{where}: tag(log, range(...)) needs integers")
        return od.FloatDistribution(float(start), float(last[-1]), step=float(step)), {}
    if isinstance(v, IntervalSweep):
        lo, hi = v.start, v.end
        if lo is None or hi is None or not lo < hi:
            raise ConfigError(f"{where}: interval({lo}, {hi}) needs a low end below the high end")
        if log and lo <= 0:
            raise ConfigError(f"{where}: tag(log, interval({lo}, {hi})) needs a low end > 0")
        if "int" in v.tags:
            return od.IntDistribution(int(lo), int(hi), log=log), {}
        return od.FloatDistribution(float(lo), float(hi), log=log), {}
    raise ConfigError(f"{where}: {o.get_value_string()} is no search range; {RANGES}")


def search_space(params: Mapping[str, Any] | None, arguments: Sequence[str]) -> SearchSpace:
    """The space of ``params`` (``{key: "interval(0, 1)"}``) and the command line's
    ``arguments``; a bad entry is a ConfigError naming it."""
    lines = {}
    for key, value in (params or {}).items():
        lines[str(key).lstrip("+~")] = (f"hydra.sweeper.params.{key}", f"{key}={value}")
    for arg in arguments:
        key = arg.split("=", 1)[0].lstrip("+~")
        lines[key] = (arg, arg)
    space = SearchSpace()
    for name, (where, line) in lines.items():
        try:
            o = _PARSER.parse_override(line)
        except HydraException as e:
            raise ConfigError(f"{where}: could not parse {line.partition('=')[2]!r} "
                              f"({str(e).splitlines()[0]}); {RANGES}") from None
        if not o.is_sweep_override():
            space.fixed.append(line)
            continue
        if o.is_hydra_override():
            raise ConfigError(f"{where}: hydra.* keys cannot be searched")
        space.distributions[name], texts = _distribution(o, where)
        space.keys[name] = o.get_key_element()
        if texts:
            space.texts[name] = texts
    return space
