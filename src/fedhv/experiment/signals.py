"""Holding stop signals (SIGINT, SIGTERM) back for the length of a block.

Two ways, for two needs:

- :func:`signals_blocked` sets the calling thread's *signal mask*. Processes started inside
  the block inherit the mask, so a grid worker that is still importing torch keeps a stop
  signal pending until it installed its handlers (``spawning_workers``).
- :func:`signals_held` defers the *Python handlers*. The kernel delivers a signal sent to
  the process to any thread that does not block it (torch's threads, a watch thread), and
  Python then runs the handler in the main thread at once; a mask set in the main thread
  alone therefore does not keep a handler out of a block. Replacing the handlers does, for
  whichever thread the signal reaches (a round's bookkeeping, ``signals_deferred``).

A run turns SIGTERM into :class:`Terminated` (:func:`sigterm_as_interrupt`), handled as Ctrl-C.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator
from types import FrameType


@contextlib.contextmanager
def signals_blocked(signals: Iterable[int]) -> Iterator[None]:
    """Block ``signals`` in the calling thread until the block ends, then restore the mask.

    A signal sent to this thread meanwhile stays pending and is delivered when the previous
    mask is restored; processes started inside the block inherit the mask. Nothing is
    blocked without ``pthread_sigmask`` (not POSIX).

    Parameters
    ----------
    signals : iterable of int
        The signals to block (e.g. ``{SIGINT, SIGTERM}``).
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def signals_held(signals: Iterable[int]) -> Iterator[None]:
    """Run no handler of ``signals`` inside the block; raise each one that arrived once, after it.

    Inside the block each signal's handler only notes the signal; on exit the previous
    handlers are restored and every noted signal is raised again (``signal.raise_signal``),
    once, in the order of arrival, as pending signals are delivered when a mask is lifted
    (an exception from one handler does not keep the later signals from being raised).
    A stop request is thus delayed by the block, never lost nor run inside it, whichever
    thread the kernel delivered it to. Python handles signals in the main thread only: in
    another thread, and for a signal whose handler was not installed from Python
    (``signal.getsignal`` is None, so it could not be restored), nothing changes.

    Parameters
    ----------
    signals : iterable of int
        The signals to hold (e.g. ``{SIGINT, SIGTERM}``).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: h for s in signals if (h := signal.getsignal(s)) is not None}
    arrived: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        if signum not in arrived:
            arrived.append(signum)

    for s in previous:
        signal.signal(s, note)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _raise_each(arrived)


def _raise_each(signals: list[int]) -> None:
    """``signal.raise_signal`` each of ``signals``; one handler's exception does not skip the later ones."""
    if signals:
        try:
            signal.raise_signal(signals[0])
        finally:
            _raise_each(signals[1:])


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived during a run; handled like Ctrl-C (the last finished round is checkpointed).

    ``signum`` is the signal; the CLI exits with ``128 + signum`` (143).
    """

    signum = int(signal.SIGTERM)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``).

    The run's ``except BaseException`` path then writes a checkpoint of the last fully
    written round, as for Ctrl-C. Only the first SIGTERM raises (a second one would cut
    that checkpoint short; it is ignored); the previous handler is restored on exit.
    Nothing changes outside the main thread (where Python cannot install handlers) or
    when SIGTERM already has a handler other than the default (e.g. a grid worker's,
    which raises ``KeyboardInterrupt`` itself, or ``SIG_IGN``).
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if fired:
            return
        fired.append(signum)
        raise Terminated(f"terminated by signal {signum} (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def signals_deferred() -> contextlib.AbstractContextManager[None]:
    """Hold SIGINT and SIGTERM back until the block ends (main thread, POSIX).

    A round's bookkeeping (its ``rounds.jsonl`` / ``metrics.jsonl`` lines, the record of
    what a checkpoint must cover, the checkpoint itself) must not be cut between its
    steps: an interrupt there would leave a written line that no checkpoint covers.
    The signal is noted and raised again when the block ends, so a stop request is never
    lost, only delayed by one round's bookkeeping (milliseconds), whichever of the
    process's threads the kernel delivered it to (:func:`~fedhv.experiment.signals.signals_held`).
    """
    return signals_held((signal.SIGINT, signal.SIGTERM))
