"""A resumed run says which code it imports and refuses code that changed since the run began.

A run whose configuration names ``data.benchmark = "module:attr"`` records the module's source
digest at its start (``environment.json["code"]``, :func:`fedhv.code_digest.code_record`). Before
a resume imports anything, :func:`check_resume_code` logs one line naming the module and the file
it will import, and compares the digest now with the recorded one: another digest (or none
recorded) is refused, unless the caller passes ``accept_changed=True`` (``fedhv run --resume DIR
--accept-changed-code``; ``fedhv flower local --resume DIR --accept-changed-code``; the App's
``accept-changed-code = true``), which resumes with one warning: the run then mixes two versions of
the code (other data or another model after the resume point).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import tomllib

from fedhv import safe_io
from fedhv.code_digest import code_record
from fedhv.errors import ConfigError
from fedhv.experiment.checkpoint import ResumeError

log = logging.getLogger("fedhv")

#: The command-line flag (and, without the dashes, the App's run-config key) that resumes anyway.
OVERRIDE = "--accept-changed-code"


def _recorded(path: Path) -> dict[str, Any] | None:
    """``environment.json`` of the run (``None`` when absent, unreadable, a link or not an object)."""
    from fedhv.results.runfiles import read_bytes_nofollow

    try:
        env = json.loads(read_bytes_nofollow(path / "environment.json"))
    except Exception:  # noqa: BLE001 - a missing, linked or malformed record counts as none recorded
        return None
    return env if isinstance(env, dict) else None


def _recorded_digest(env: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """The digest the run recorded for the module: ``code.sha256``; for runs written before it was
    recorded, ``data.user.sha256`` (the factory module's file) when that file is the module's."""
    if env is None:
        return None
    code = env.get("code")
    if isinstance(code, dict) and code.get("benchmark") == now["benchmark"]:
        sha = code.get("sha256")
        return sha if isinstance(sha, str) else None
    user = (env.get("data") or {}).get("user") if isinstance(env.get("data"), dict) else None
    if isinstance(user, dict) and user.get("file") == now["file"] and isinstance(user.get("sha256"), str):
        try:
            digest = hashlib.sha256(safe_io.read_regular(now["file"], follow=True)).hexdigest()
        except OSError:
            return None
        return now["sha256"] if digest == user["sha256"] else user["sha256"]
    return None


#: ``(run directory, data.benchmark, the module's digest, accept_changed)`` already checked in this process.
_CHECKED: set[tuple[str, str, str | None, bool]] = set()


def check_resume_code(path: Path, config_text: str, accept_changed: bool = False) -> dict[str, Any] | None:
    """Name the module the run at ``path`` will import and refuse it when its source changed.

    ``config_text``: the run's ``config.toml`` (read, not validated: validating imports the module).
    Returns the module's record now (``None`` when the benchmark is a registered name).

    Raises
    ------
    ResumeError
        The module's digest differs from the one recorded at the run's start (or none was
        recorded, or it cannot be located without importing it), and ``accept_changed`` is false;
        the message names the module, its file and :data:`OVERRIDE`.
    """
    try:
        data = tomllib.loads(config_text).get("data")
    except tomllib.TOMLDecodeError:
        return None  # the configuration's own check reports it, naming the file
    benchmark = data.get("benchmark") if isinstance(data, dict) else None
    if not isinstance(benchmark, str):
        return None
    try:
        now = code_record(benchmark)
    except ConfigError:
        return None  # a malformed reference: the configuration's own check reports it
    if now is None:
        return None
    key = (str(Path(path).resolve()), benchmark, now["sha256"], accept_changed)
    if key in _CHECKED:  # the same run, module and source already checked in this process (an entry point
        return now       # checks before its handshake, the runner again): said and decided once
    where = now["file"] or "a file not found without importing it"
    log.warning("resume: data.benchmark = %r: importing module %r from %s (sha256 %s)", benchmark, now["module"],
                where, (now["sha256"] or "unknown")[:16])
    recorded = _recorded_digest(_recorded(path), now)
    if recorded is not None and recorded == now["sha256"]:
        _CHECKED.add(key)
        return now
    why = ("its source changed since the run began (sha256 "
           f"{recorded[:16]} then, {(now['sha256'] or 'unknown')[:16]} now)") if recorded else (
        "the run recorded no digest of it (environment.json has no code record)")
    if accept_changed:
        log.warning("resume: module %r (%s): %s; resuming anyway (%s): the run mixes two versions of the code",
                    now["module"], where, why, OVERRIDE)
        _CHECKED.add(key)
        return now
    raise ResumeError(f"resume {path}: data.benchmark = {benchmark!r}: module {now['module']!r} ({where}): {why}; "
                      "resuming would mix two versions of the code in one run (other data or model): restore "
                      f"the module, start a new run, or pass {OVERRIDE} to resume anyway")
