"""Load, override, resolve and dump run configurations.

A SETTING is a preset name (``fedhv/config/presets/<name>.toml``) or a path to a
TOML file; a TOML file may start from a preset with ``extends = "<name>"``.
``--set a.b=value`` overrides are parsed as TOML values (bare words are strings).
Unknown keys are rejected with a did-you-mean suggestion; values are type-checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from fedhv import safe_io
from fedhv.config.schema import RunConfig
from fedhv.config.validation import validate
from fedhv.errors import ConfigError
from fedhv.registry import METHODS

PRESET_PACKAGE = "fedhv.config"


def preset_names() -> list[str]:
    """Names of the bundled presets."""
    folder = resources.files(PRESET_PACKAGE) / "presets"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


#: Deepest nesting of arrays / tables accepted in a TOML file or a ``--set`` value (the
#: schema needs 3: ``lr.fedhv.global``); deeper input is refused before it can exhaust
#: the parser's recursion.
MAX_DEPTH = 32
#: Longest ``extends`` chain accepted.
MAX_EXTENDS = 32


def _short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _too_deep(origin: str) -> ConfigError:
    return ConfigError(f"{origin} nests arrays or tables more than {MAX_DEPTH} levels deep; flatten the value")


def _check_depth(value: Any, origin: str) -> None:
    """Refuse values nested more than :data:`MAX_DEPTH` levels (iterative, never recurses)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children: Iterable[Any] = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth >= MAX_DEPTH:
            raise _too_deep(origin)
        stack.extend((child, depth + 1) for child in children)


def _read_toml(text: str, origin: str) -> dict[str, Any]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin} is not valid TOML: {exc}") from None
    except RecursionError:
        raise _too_deep(origin) from None
    _check_depth(data, origin)
    return data


#: Bound on a configuration file (a real one is a few kB).
MAX_CONFIG_BYTES = 16 << 20


def _read_text(path: Path, origin: str) -> str:
    """The UTF-8 text of ``path``; unreadable or non-UTF-8 files raise :class:`ConfigError`."""
    try:
        raw = safe_io.read_regular(path, MAX_CONFIG_BYTES, follow=True)  # a FIFO or a device: refused, no hang
    except safe_io.UnsafeFileError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read the file ({exc.strerror or exc}); check the path") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{origin} is not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); "
            "TOML files must be UTF-8: re-save it as UTF-8"
        ) from None


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated with ``top``, tables merged key by key (recursively), other values replaced."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def load_setting(setting: str) -> dict[str, Any]:
    """Raw dictionary of a preset name or TOML file, with ``extends`` resolved.

    ``extends = "<preset>"`` names a bundled preset; any other value is a path to a TOML
    file, relative to the directory of the file that contains the ``extends`` line (not
    the working directory). The including file is deep-merged over its base: tables are
    merged key by key, other values replaced.

    Raises
    ------
    ConfigError
        Unknown setting, unreadable / non-UTF-8 / invalid TOML file, a non-string
        ``extends``, or an ``extends`` cycle (the message lists every file in it).
    """
    return _load_setting(setting, None, ())


def _load_setting(setting: str, base_dir: Path | None,
                  chain: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """Load ``setting``; ``base_dir`` is the including file's directory, ``chain`` the
    ``(identity, display name)`` of every setting that led here."""
    includer = chain[-1][1] if chain else None
    where = f"extends = {setting!r} in {includer}" if includer else f"SETTING {setting!r}"
    path = Path(setting)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if setting in preset_names():
        ident, name, folder = f"preset:{setting}", f"preset {setting!r}", None
    elif base_dir is None and chain:
        raise ConfigError(f"{where}: a preset can only extend another preset ({', '.join(preset_names())})")
    elif path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"{where}: no such file {str(path)!r}")
        ident, name, folder = str(path.resolve()), str(path), path.parent
    else:
        hint = difflib.get_close_matches(setting, preset_names(), n=1)
        raise ConfigError(
            f"{where} is neither a preset nor a TOML file"
            + (f"; did you mean {hint[0]!r}?" if hint else "")
            + f" Presets: {', '.join(preset_names())}"
        )
    seen = [i for i, _ in chain]
    if ident in seen:
        loop = [n for _, n in chain[seen.index(ident):]] + [name]
        raise ConfigError(f"extends cycle: {' -> '.join(loop)}; remove one of these extends lines")
    if len(chain) >= MAX_EXTENDS:
        raise ConfigError(f"{where}: extends chain longer than {MAX_EXTENDS} files; shorten it")
    if folder is None:
        text = (resources.files(PRESET_PACKAGE) / "presets" / f"{setting}.toml").read_text(encoding="utf-8")
        data = _read_toml(text, name)
        data.setdefault("setting", setting)
    else:
        data = _read_toml(_read_text(path, name), name)
        data.setdefault("setting", path.stem)
    base = data.pop("extends", None)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{name}: extends = {_short(base)} must be a preset name or a TOML file path")
        parent = _load_setting(base, folder, chain + ((ident, name),))
        data = _deep_merge(parent, data)
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``a.b=value``; the value is TOML, or a bare string."""
    if "=" not in item:
        raise ConfigError(f"--set {_short(item)}: expected key=value, e.g. --set train.local_steps=5")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {_short(item)}: empty key")
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"--set {_short(item)}: not valid UTF-8 text; pass the value as UTF-8") from None
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    except RecursionError:
        raise _too_deep(f"--set {key}={_short(raw, 30)}") from None
    _check_depth(value, f"--set {key}={_short(raw, 30)}")
    return key.split("."), value


def _parsed(item: str) -> list[tuple[list[str], Any]]:
    """The ``(key path, value)`` pairs of one ``--set`` item: :func:`parse_override` of a one-line item; an item
    holding new lines is TOML ``key = value`` statements parsed whole, as the Flower App's ``set``
    (:func:`fedhv.flower.runconf.parse_set`): every statement applies, or an error applies none (``a=1\\nb=2`` read
    as ``a = 1`` once, ``b`` dropped without a word)."""
    if "\n" not in item and "\r" not in item:
        return [parse_override(item)]
    try:
        table = tomllib.loads(item)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--set {_short(item)} holds several lines, read as TOML key = value statements, and is not "
                          f"TOML ({exc}); quote strings (data.benchmark = 'pkg.mod:make') or give one --set per "
                          "override; nothing was applied") from None
    except RecursionError:
        raise _too_deep(f"--set {_short(item, 30)}") from None
    _check_depth(table, f"--set {_short(item, 30)}")
    pairs: list[tuple[list[str], Any]] = []

    def leaves(node: Mapping[str, Any], prefix: list[str]) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping) and value:
                leaves(value, [*prefix, key])
            else:
                pairs.append(([*prefix, key], value))

    leaves(table, [])
    if not pairs:
        raise ConfigError(f"--set {_short(item)}: no key = value in it; e.g. --set train.local_steps=5")
    return pairs


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to a raw config dictionary (an item of several lines: :func:`_parsed`).

    A table value is deep-merged into the table it overrides, as an including TOML
    file's tables are merged over its ``extends`` base: ``--set 'train={local_steps=2}'``
    changes ``train.local_steps`` only. Other values replace the old one.
    """
    out = dict(data)
    for path, value in [pair for item in overrides for pair in _parsed(item)]:  # all parsed before any applies
        node = out
        for part in path[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, Mapping) else {}
            node[part] = child
            node = child
        old = node.get(path[-1])
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            value = _deep_merge(dict(old), value)
        node[path[-1]] = value
    return out


def _toml_key(field_name: str) -> str:
    return field_name.rstrip("_")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "unset"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where} = {_short(value, 80)} has the wrong type; expected {_type_name(tp)}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} = {_short(value, 80)} must be a list of {_type_name(typing.get_args(tp)[0])}")
        inner = typing.get_args(tp)[0]
        return tuple(_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a table, got {_short(value, 80)}")
        inner = typing.get_args(tp)[1]
        return {str(k): _coerce(v, inner, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a table, got {_short(value, 80)}")
        return build(typing.cast(type, tp), value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{where} = {_short(value, 80)} must be a finite number")
            return float(value)
    elif tp is str and isinstance(value, str):
        return value
    raise ConfigError(f"{where} = {_short(value, 80)} has the wrong type; expected {_type_name(tp)}")


def build(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    fields = {_toml_key(f.name): f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{where}.{key}" if where else key
        if key not in fields:
            hint = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            suggestion = f"; did you mean {(where + '.' if where else '') + hint[0]!r}?" if hint else ""
            raise ConfigError(
                f"unknown config key {full!r}{suggestion} Valid keys here: {', '.join(sorted(fields))}"
            )
        f = fields[key]
        kwargs[f.name] = _coerce(value, hints[f.name], full)
    return cls(**kwargs)


#: ``RunConfig`` fields that a TOML file sets by their own name (``sections`` is the methods' tables).
_RUN_KEYS = tuple(_toml_key(f.name) for f in dataclasses.fields(RunConfig) if f.name != "sections")


def method_name(name: str) -> str:
    """``name``, or its lower case when only that is a registered method (``"FedHV"`` -> ``"fedhv"``)."""
    if isinstance(name, str) and name not in METHODS and name.lower() in METHODS:
        return name.lower()
    return name


def build_run_config(data: Mapping[str, Any]) -> RunConfig:
    """A :class:`RunConfig` from a raw dictionary: its fields by name, and each registered method's
    ``[name]`` table as that method's section (built and type-checked like every other table)."""
    rest: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    for key, value in data.items():
        if key in _RUN_KEYS:
            rest[key] = value
        elif key in METHODS:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key} must be a table (the [{key}] section of method {key!r}), got "
                                  f"{_short(value, 80)}")
            sections[key] = build(METHODS.get(key).section, value, key)
        else:
            known = [*_RUN_KEYS, *METHODS.names()]
            hint = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"unknown config key {key!r}{suggestion} Valid keys here: {', '.join(sorted(_RUN_KEYS))}; "
                              f"and a method's section: {', '.join(METHODS.names())}")
    return dataclasses.replace(build(RunConfig, rest), sections=sections)


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill method-dependent values: learning rates from ``[lr.<method>]``, and the method's own
    section (its defaults when the configuration gives none), so ``config.toml`` records it."""
    rates = cfg.lr.get(cfg.method)
    borrowed = getattr(METHODS.get(cfg.method), "rates_from", None)  # e.g. a loss-only method: FedHV's rates
    if rates is None and borrowed is not None:
        rates = cfg.lr.get(borrowed)
    lr_g = cfg.train.lr_global if cfg.train.lr_global is not None else (rates.global_ if rates else None)
    lr_l = cfg.train.lr_local if cfg.train.lr_local is not None else (rates.local if rates else None)
    if lr_g is None or lr_l is None:
        raise ConfigError(
            f"no learning rates for method {cfg.method!r}: set train.lr_global and train.lr_local "
            f"or add a [lr.{cfg.method}] table with 'global' and 'local'"
        )
    train = dataclasses.replace(cfg.train, lr_global=lr_g, lr_local=lr_l)
    return dataclasses.replace(cfg, train=train).with_section(cfg.method, cfg.section(cfg.method))


def load_config(setting: str, overrides: Iterable[str] = (), import_code: bool = True) -> RunConfig:
    """Preset or TOML file + overrides -> validated, resolved :class:`RunConfig`.

    ``import_code=False``: a ``module:attr`` benchmark is not imported (:func:`validate`)."""
    data = apply_overrides(load_setting(setting), overrides)
    cfg = build_run_config(data)
    cfg = dataclasses.replace(cfg, method=method_name(cfg.method))  # method = "FedHV" is fedhv
    validate(cfg, import_code)
    return resolve(cfg)


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain dict with TOML key names (``None`` fields omitted); a :class:`RunConfig`'s
    method sections become top-level tables by method name (empty ones left out)."""
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is not None and not (isinstance(obj, RunConfig) and f.name == "sections"):
                out[_toml_key(f.name)] = to_dict(value)
        if isinstance(obj, RunConfig):
            out.update({name: table for name, table in ((n, to_dict(v)) for n, v in obj.sections.items()) if table})
        return out
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    return obj


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {_short(value, 80)} as TOML")


def dumps(data: Mapping[str, Any], prefix: str = "") -> str:
    """Serialise a nested dict of scalars, lists and tables as TOML."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, Mapping)]
    for key, value in data.items():
        if isinstance(value, Mapping):
            name = f"{prefix}{key}"
            scalars = {k: v for k, v in value.items() if not isinstance(v, Mapping)}
            if scalars or not value:
                lines.append("")
                lines.append(f"[{name}]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
            nested = {k: v for k, v in value.items() if isinstance(v, Mapping)}
            if nested:
                lines.append(dumps(nested, prefix=f"{name}."))
    return "\n".join(lines).strip("\n") + "\n"


def config_from_toml_text(text: str, device: str | None = None) -> RunConfig:
    """Rebuild a resolved config from a run directory's ``config.toml``.

    ``device``, if given, replaces the file's ``device`` before validation (a run
    resumed on another machine or GPU).
    """
    cfg = build_run_config(_read_toml(text, "config.toml"))
    if device is not None:
        cfg = dataclasses.replace(cfg, device=device)
    validate(cfg)
    return resolve(cfg)
