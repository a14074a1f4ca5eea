"""Argument helpers shared by the ``fedhv`` commands (:mod:`fedhv.cli`, :mod:`fedhv.cli_grid`)."""

from __future__ import annotations

from fedhv.errors import FedHVError


class UsageError(FedHVError):
    """Wrong command-line usage."""


def method_arg(name: str) -> str:
    """A method name with the registered ones matched case-insensitively (``FedHV`` -> ``fedhv``)."""
    from fedhv.config.loader import method_name

    return method_name(name)


def quote(value: str) -> str:
    """``value`` as a TOML basic string (for ``--set key=value`` overrides)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def csv_list(flag: str, text: str, cast: type) -> list:
    """``text`` (``a,b,c``) as a list of ``cast`` values; an empty or ill-typed list is a usage error."""
    try:
        items = [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: give a comma-separated list, e.g. {flag} 0,42,2026") from None
    if not items:
        raise UsageError(f"{flag} is empty")
    return items
