"""The configuration side of a Flower run of fedhv: the setting with one client per SuperNode,
the generated app's ``pyproject.toml``, a run directory's configuration to resume and its lock, and the
default run directory name (shared by ``fedhv flower local`` and the Flower App)."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

from fedhv import safe_io
from fedhv.config import load_config
from fedhv.config.flower import MAX_NODES, refuse_on_flower
from fedhv.config.loader import _toml_value, apply_overrides, build_run_config, load_setting
from fedhv.config.schema import RunConfig
from fedhv.flower.procs import FlowerRunError

#: Configuration keys a ``set`` override must not name, because a run-config key of the App gives
#: them (configuration key -> the App's run-config key).
SET_CONFLICTS: dict[str, str] = {"setting": "setting", "method": "method", "seed": "seed", "rounds": "rounds",
                                 "partition.clients": "clients"}
_KEY_PART = re.compile(r"^[A-Za-z0-9_-]+$")


def local_config(setting: str, nodes: int, overrides: Sequence[str] = ()) -> RunConfig:
    """The setting with one client per SuperNode: ``partition.clients = nodes`` and at most
    ``nodes`` clients per round (the configured count otherwise).

    The overrides are validated only together with ``partition.clients = nodes``: a
    ``train.clients_per_round`` above the preset's client count is valid on enough nodes.
    """
    if nodes < 1:
        raise FlowerRunError(f"--nodes {nodes}: need at least one SuperNode; give --nodes 1 or more")
    if nodes > MAX_NODES:
        raise FlowerRunError(f"--nodes {nodes}: at most {MAX_NODES} SuperNodes (one per client); give fewer")
    extra = [f"partition.clients={nodes}"]
    base = build_run_config(apply_overrides(load_setting(setting), [*overrides, *extra]))  # not validated yet
    if base.train.clients_per_round > nodes:
        extra.append(f"train.clients_per_round={nodes}")
    cfg = load_config(setting, [*overrides, *extra])
    refuse_on_flower(cfg)
    return cfg


def app_pyproject(run_config: dict[str, Any]) -> str:
    """The generated Flower app's ``pyproject.toml``."""
    cfg = "\n".join(f"{k} = {json.dumps(v)}" for k, v in run_config.items())
    return f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedhv-flower"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedhv"

[tool.flwr.app.components]
serverapp = "fedhv.flower.app:server_app"
clientapp = "fedhv.flower.client:app"

[tool.flwr.app.config]
{cfg}
"""


def _statements(text: str) -> str:
    """``text`` with each ``;`` outside a TOML string turned into a new line (``set``'s separators; a
    ``;`` also ends a ``#`` comment)."""
    out, i, quote, comment = [], 0, "", False
    while i < len(text):
        c = text[i]
        if comment:
            comment = c not in ";\n"
            c = "\n" if c == ";" else c
        elif quote:
            if quote == '"' and c == "\\":  # an escape inside a basic string: keep both characters
                out.append(text[i:i + 2])
                i += 2
                continue
            if text.startswith(quote, i):
                out.append(quote)
                i += len(quote)
                quote = ""
                continue
        elif c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            out.append(quote)
            i += len(quote)
            continue
        elif c == "#":
            comment = True
        elif c == ";":
            c = "\n"
        out.append(c)
        i += 1
    return "".join(out)


def _leaves(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``(dotted key, value)`` of every non-table value of ``table``."""
    out: list[tuple[str, Any]] = []
    for key, value in table.items():
        if not _KEY_PART.match(key):
            raise FlowerRunError(f"run config set: key {prefix + key!r} is not a fedhv configuration key (letters, "
                                 "digits, '_' and '-' joined by '.'); nothing was applied")
        if isinstance(value, Mapping) and value:
            out.extend(_leaves(value, f"{prefix}{key}."))
        else:
            out.append((prefix + key, value))
    return out


def parse_set(text: str) -> tuple[str, ...]:
    """The App's ``set`` run-config value as ``--set`` overrides ``key=<TOML value>``.

    ``text`` is TOML: ``key = value`` statements (dotted keys, any value TOML allows, a string
    quoted: ``data.benchmark = 'pkg.mod:make'``), separated by new lines or by ``;`` outside
    strings. It is parsed whole: a TOML error, a key given twice or a value TOML cannot express
    refuses every override (none is applied), with one line naming the problem.
    """
    try:
        table = tomllib.loads(_statements(text))
    except tomllib.TOMLDecodeError as exc:
        raise FlowerRunError(f"run config set = {text!r} is not TOML ({exc}); write each override as key = value "
                             "(strings quoted, e.g. data.benchmark = 'pkg.mod:make'), separated by ';' or new lines; "
                             "nothing was applied") from None
    except RecursionError:
        raise FlowerRunError("run config set: values nested too deeply; nothing was applied") from None
    out = []
    for key, value in _leaves(table):
        try:
            raw = _toml(value)
            same = _toml(tomllib.loads(f"v = {raw}")["v"]) == raw  # what parse_override reads back
        except (TypeError, tomllib.TOMLDecodeError):
            same = False
        if not same:
            raise FlowerRunError(f"run config set: {key} = {value!r} is not a value a fedhv configuration holds "
                                 "(a number, string, boolean or list of them); nothing was applied")
        out.append(f"{key}={raw}")
    return tuple(out)


def _toml(value: Any) -> str:
    """``value`` as a TOML value (strings with every character TOML needs escaped)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        raise TypeError("a table inside a list")
    return _toml_value(value)


def set_conflicts(overrides: Sequence[str], given: Mapping[str, object]) -> None:
    """Refuse a ``set`` override of a configuration key that the App's run-config key ``given`` names
    (:data:`SET_CONFLICTS`): one line naming both."""
    for item in overrides:
        key = item.split("=", 1)[0]
        app_key = SET_CONFLICTS.get(key)
        if app_key is not None and app_key in given:
            raise FlowerRunError(f"run config set names {key} and the run config key {app_key} "
                                 f"(= {given[app_key]!r}) gives it too; give it once: as --run-config "
                                 f"'{app_key}=...' and drop {key} from set")


def read_run_config(run_dir: str | Path, what: str = "--resume") -> str:
    """The text of ``run_dir/config.toml``; a link, a FIFO, a device or a missing file is refused (one
    line) before anything is read."""
    path = Path(run_dir) / "config.toml"
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        raise FlowerRunError(f"{what} {run_dir}: no config.toml there; give the directory of a fedhv run") from None
    if stat.S_ISLNK(mode):
        raise FlowerRunError(f"{what} {run_dir}: {path} is a symbolic link (to {os.readlink(path)}); fedhv never "
                             "follows links in a run directory: remove the link, or use a directory you made")
    if not stat.S_ISREG(mode):
        raise FlowerRunError(f"{what} {run_dir}: {path} is not a regular file; give the directory of a fedhv run")
    try:  # the one safe reader: no link followed, a file replaced after the check refused, 16 MiB at most
        data = safe_io.read_regular(path, safe_io.MiB * 16)
    except (safe_io.UnsafeFileError, OSError) as exc:
        raise FlowerRunError(f"{what} {run_dir}: {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FlowerRunError(f"{what} {run_dir}: {path} is not UTF-8 text; give the directory of a fedhv run") from None


def resume_config(run_dir: str | Path, accept_changed_code: bool = False) -> RunConfig:
    """The configuration of the run directory ``run_dir`` to resume (one-line error when it is none).

    A ``module:attr`` benchmark is named (one log line) and its source digest checked against the
    run's record before the configuration's check imports it
    (:func:`fedhv.experiment.code_check.check_resume_code`; ``accept_changed_code`` resumes anyway)."""
    from fedhv.config.loader import config_from_toml_text
    from fedhv.experiment.code_check import check_resume_code

    text = read_run_config(run_dir)
    check_resume_code(Path(run_dir), text, accept_changed_code)
    return config_from_toml_text(text)


def default_out(cfg: RunConfig) -> Path:
    """``runs/<setting>-<method>-s<seed>-flower-<time>`` (not created here: the ServerApp claims it)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{Path(cfg.setting).stem}-{cfg.method}-s{cfg.seed}-flower-{stamp}"


def hold_run_dir(run_dir: str | Path | None, resume: bool) -> Any:
    """The lock of an existing run directory (a run to resume, or an ``--out`` that holds a lock
    file), taken before any process starts: a directory another process uses is refused at once
    (:class:`~fedhv.results.rundir.RunDirBusy`) instead of after a whole deployment started."""
    from fedhv.results.rundir import LOCK_FILE, RunDir

    if run_dir is None:
        return None
    path = Path(run_dir)
    if not resume and (not path.is_dir() or not (path / LOCK_FILE).exists()):
        return None
    return RunDir(path)
