"""Error types raised for bad input.

Every error raised for user input derives from :class:`FedHVError`; the CLI prints
its message (which names the parameter, the value found and the fix) without a
traceback and exits with status 2.
"""

from __future__ import annotations


class FedHVError(Exception):
    """Base class of all user-facing fedhv errors."""


class ConfigError(FedHVError, ValueError):
    """An invalid configuration key or value."""


class DataError(FedHVError, OSError):
    """Missing, corrupted or unreadable data files."""
