"""A test-only kill point: a run that stops still after a named round, so a test can SIGKILL it there.

Set :data:`PAUSE_ENV` to a round number (and, for a Flower deployment whose ServerApps share one
environment, :data:`PAUSE_RUN_ENV` to the run directory's name); the runner calls
:func:`pause_for_tests` after each round's bookkeeping. Nothing happens unless the variable is set.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fedhv import safe_io

#: Test-only hook (``tests/unit/experiment/test_resume.py``): ``FEDHV_TEST_PAUSE_AFTER_ROUND=<n>`` makes a run
#: stop still after round ``n`` is fully recorded, so a test can SIGKILL it at a known point.
PAUSE_ENV = "FEDHV_TEST_PAUSE_AFTER_ROUND"
PAUSE_FILE = ".test-paused"
#: Test-only, with :data:`PAUSE_ENV`: only the run directory of this name pauses (for a Flower
#: deployment, whose ServerApps all inherit the environment it started with).
PAUSE_RUN_ENV = "FEDHV_TEST_PAUSE_RUN"


def pause_for_tests(run_path: Path, round_done: int) -> None:
    """Test-only: after round ``round_done`` named by :data:`PAUSE_ENV`, wait to be killed.

    Called after the round's bookkeeping (lines, checkpoint), outside
    :func:`signals_deferred`. Writes ``run_path/.test-paused`` (the round) as the signal
    that the process is paused, then sleeps; after 10 minutes it goes on, so a test that
    failed to kill it leaves no process behind for long. No effect unless the variable is set.
    """
    if os.environ.get(PAUSE_ENV) != str(round_done):
        return
    want = Path(os.environ.get(PAUSE_RUN_ENV, run_path.name)).parts  # a name, or a path's last parts
    if run_path.parts[-len(want):] != want:
        return
    safe_io.write_atomic_bytes(run_path / PAUSE_FILE, str(round_done).encode())
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.05)
