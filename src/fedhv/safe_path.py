"""No code from the working directory: the Python processes fedhv starts run with a safe ``sys.path``.

``python -m module`` and ``python -c …`` (what :mod:`multiprocessing`'s spawn start method runs)
put the current working directory first on ``sys.path``, so a file such as ``argparse.py`` or
``json.py`` in the folder a command was started from would be imported instead of the standard
library's, and run. Python 3.11's ``-P`` flag, or ``PYTHONSAFEPATH=1`` in the environment, leaves
that entry out (and a script's own folder); the environment variable reaches every Python
process the child starts in turn (Flower's ``flwr-serverapp`` / ``flwr-clientapp`` processes).

- :data:`SAFE_PATH_ENV`: the variables to add to a child's environment;
- :func:`safe_child_path`: for the length of a block, this process's environment carries them,
  for the children that inherit it (a :class:`~concurrent.futures.ProcessPoolExecutor`'s
  spawn workers and multiprocessing's resource tracker).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["SAFE_PATH_ENV", "safe_child_path", "scoped_environ"]

#: What keeps the working directory (and a script's folder) off a child interpreter's ``sys.path``.
SAFE_PATH_ENV: dict[str, str] = {"PYTHONSAFEPATH": "1"}


@contextlib.contextmanager
def scoped_environ(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block (children started in it inherit them), then
    restore the previous values (a variable that was unset is removed again)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def safe_child_path() -> contextlib.AbstractContextManager[None]:
    """Set :data:`SAFE_PATH_ENV` in ``os.environ`` for the block (:func:`scoped_environ`)."""
    return scoped_environ(SAFE_PATH_ENV)
