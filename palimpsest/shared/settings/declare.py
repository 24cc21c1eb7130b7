"""One declaration per setting: its environment variable, unit, default, validation and doc line.

``Settings`` (the groups of this package) declares each field with ``setting(...)``; this module
reads the environment from those declarations (types from the fields' annotations), warns once
about old names still read, and renders the tables of docs/settings.md: a default is written once.
"""

from __future__ import annotations

import logging
import math
import os
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, get_args, get_type_hints

log = logging.getLogger("palimpsest.settings")

T = TypeVar("T")

# The one prefix of the house's own variables, and the unit suffixes a name ends in when its value has a unit.
PREFIX = "PALIMPSEST_"
UNITS = {"seconds": "_SECONDS", "ms": "_MS", "MB": "_MB", "bytes": "_BYTES", "tokens": "_TOKENS"}
_SCALE = {"MB": 1024 * 1024}  # a field holds bytes where its variable says megabytes
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Env:
    """How one setting is read from the environment and documented."""

    name: str
    doc: str
    default: Any = None  # in the variable's unit (megabytes, not the field's bytes)
    unit: str = ""  # a key of UNITS, or "" when the value has none
    old: tuple[str, ...] = ()  # names read before, still read (with a warning) for one release
    also: tuple[str, ...] = ()  # the ecosystem's other names for it, read in order when `name` is unset
    least: float | None = None
    choices: tuple[str, ...] = ()
    convert: Callable[[str], Any] | None = None  # raw text -> value; ValueError(what it must be)
    derive: Callable[[Any], Any] | None = None  # unset: made from the other settings, as read
    default_doc: str = ""  # the default as the docs show it, when it is not a plain value
    to_bytes: bool = True  # a size in MB is held in bytes (False: the field keeps megabytes)
    empty: bool = False  # set and empty is a value of its own (turns a feature off), not the default

    @property
    def scale(self) -> int:
        return _SCALE.get(self.unit, 1) if self.to_bytes else 1


def setting(name: str, default: T, doc: str, **opts: Any) -> T:
    """A Settings field read from ``name`` (``opts``: the other fields of ``Env``)."""
    env = Env(name, doc, default, **opts)
    value: Any = default * env.scale if env.scale != 1 and isinstance(default, int) else default
    return field(default=value, metadata={"env": env})  # the dataclass finds its default and declaration here


def setting_from(name: str, factory: Callable[[], T], doc: str, **opts: Any) -> T:
    """A Settings field whose default is made when a Settings is (a folder of the user's, say)."""
    return field(default_factory=factory, metadata={"env": Env(name, doc, **opts)})


_DECLARED: dict[type, tuple[tuple[str, Env, Any], ...]] = {}


def declarations(cls: type) -> tuple[tuple[str, Env, Any], ...]:
    """(field name, declaration, field type) of every declared field of a dataclass, in order;
    read once per class (get_type_hints evaluates every annotation), not per Settings made."""
    if cls not in _DECLARED:
        hints = get_type_hints(cls)
        fields: dict[str, Field[Any]] = cls.__dataclass_fields__  # type: ignore[attr-defined]
        _DECLARED[cls] = tuple(
            (f.name, f.metadata["env"], hints[f.name]) for f in fields.values() if "env" in f.metadata
        )
    return _DECLARED[cls]


class SettingError(SystemExit):
    """A variable whose value cannot be used: the message names it, what it must be and what it got."""


def read(cls: type[T], environ: Mapping[str, str] | None = None) -> T:
    """An instance of ``cls`` from the environment; every old name read is warned about once."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    renamed: list[tuple[str, str]] = []
    derived = []
    for attr, env, kind in declarations(cls):
        found = _lookup(env, environ, renamed)
        if found is not None:
            values[attr] = _parse(env, kind, *found)
        elif env.derive is not None:
            derived.append((attr, env.derive))
    warn_renamed(renamed)
    # Defaults made from other settings (the data folder's subfolders): from the settings as read.
    first = cls(**values)
    return replace(first, **{attr: derive(first) for attr, derive in derived})  # type: ignore[type-var]


def complete(settings: Any) -> None:
    """Fill the derived fields a frozen dataclass was made with empty ("" or None), e.g. by a test."""
    for attr, env, _ in declarations(type(settings)):
        if env.derive is not None and getattr(settings, attr) in ("", None):
            object.__setattr__(settings, attr, env.derive(settings))


def _lookup(env: Env, environ: Mapping[str, str], renamed: list[tuple[str, str]]) -> tuple[str, str] | None:
    """(the variable read, its text): the new name wins over old ones; empty is unset unless the
    declaration says otherwise."""

    def given(name: str) -> bool:
        return name in environ and (env.empty or bool(environ[name].strip()))

    for name in (env.name, *env.also):
        if given(name):
            renamed.extend((old, env.name) for old in env.old if given(old))
            return name, environ[name].strip()
    for old in env.old:
        if given(old):
            renamed.append((old, env.name))
            return old, environ[old].strip()
    return None


_warned: set[tuple[str, str]] = set()


def warn_renamed(pairs: Iterable[tuple[str, str]]) -> None:
    """One warning naming each old variable set and its new name, once per process."""
    new = sorted(set(pairs) - _warned)
    if not new:
        return
    _warned.update(new)
    log.warning(
        "old setting names, read for this release only (the new name wins when both are set): %s",
        ", ".join(f"{old} -> {name}" for old, name in new),
    )


def _parse(env: Env, kind: Any, var: str, raw: str) -> Any:
    try:
        value = env.convert(raw) if env.convert else _convert(kind, raw, env.choices)
    except ValueError as exc:
        raise SettingError(f"{var} must be {exc}, got {raw!r}") from None
    if env.least is not None and not value >= env.least:
        raise SettingError(f"{var} must be a number of at least {env.least:g}, got {raw!r}")
    return value * env.scale if env.scale != 1 else value


def _convert(kind: Any, raw: str, choices: tuple[str, ...]) -> Any:
    """``raw`` as the field's type; ValueError says what it must be."""
    if isinstance(kind, types.UnionType):  # `int | None`: set means the number
        kind = next(k for k in get_args(kind) if k is not type(None))
    if kind is bool:
        if raw.lower() not in TRUE + FALSE:
            raise ValueError(f"true or false ({', '.join(TRUE)} / {', '.join(FALSE)})")
        return raw.lower() in TRUE
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError("a whole number") from None
    if kind is float:
        try:
            number = float(raw)
        except ValueError:
            raise ValueError("a number") from None
        if not math.isfinite(number):
            raise ValueError("a finite number")
        return number
    if choices and raw.lower() not in choices:
        raise ValueError(f"one of {', '.join(choices)}")
    if kind is Path:
        return Path(raw)
    return raw.lower() if choices else raw


# The docs' table, between these markers in docs/settings.md.
BEGIN, END = "<!-- settings table: generated by `python -m palimpsest.shared.settings --docs` -->", "<!-- end -->"


def table(entries: Iterable[Env]) -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| {_names(env)} | {_default(env)} | {_doc(env)} |" for env in entries]
    return "\n".join(rows)


def old_names_table(entries: Iterable[Env]) -> str:
    rows = ["| old name | read as |", "| --- | --- |"]
    rows += [f"| `{old}` | `{env.name}` |" for env in entries for old in env.old]
    return "\n".join(rows)


def _names(env: Env) -> str:
    return " / ".join(f"`{name}`" for name in (env.name, *env.also))


def _default(env: Env) -> str:
    if env.default_doc:
        return env.default_doc
    if env.default is None or env.default == "":
        return "*(unset)*"
    if isinstance(env.default, bool):
        return f"`{str(env.default).lower()}`"
    return (
        f"`{env.default:g}` {env.unit}".rstrip()
        if isinstance(env.default, float)
        else f"`{env.default}` {env.unit}".rstrip()
    )


def _doc(env: Env) -> str:
    choices = f" One of {', '.join(f'`{c}`' for c in env.choices)}." if env.choices else ""
    least = f" At least {env.least:g}." if env.least is not None else ""
    return f"{env.doc}.{choices}{least}".replace("|", "\\|")


def spliced(document: str, generated: str) -> str:
    """``document`` with the part between the markers replaced by ``generated``."""
    head, sep, rest = document.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ValueError(f"the markers {BEGIN!r} and {END!r} are missing")
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"
