"""The SuperLink's Control API, in process: start a run, read its status, stop it.

``flwr run APP local`` as a subprocess costs a Python start and flwr's CLI import (1–2.5 s
per run on a 2-core machine) for what is one HTTP request; :func:`start_run` builds the
app's FAB and sends the same ``StartRun`` request from this process, with flwr 1.42's own
helpers (``flwr.cli.build.build_fab_from_disk``, ``flwr.cli.config_utils.load_and_validate``,
the request ``flwr run`` sends without ``--run-config`` / ``--federation-config``).
:func:`run_status` and :func:`stop_run` read and stop a run as ``flwr ls`` / ``flwr stop``
do. Each call opens its own connection (TLS verified against ``root_certificates`` when
given) and closes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedhv.flower.procs import FlowerRunError


@contextlib.contextmanager
def control_client(port: int, root_certificates: str | None = None) -> Iterator[Any]:
    """A Control API client of the SuperLink on ``127.0.0.1:port``, closed on exit.

    flwr prints "Using SuperLink: ..." on creation and its click use warns of deprecations;
    both are silenced here.
    """
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from flwr.cli.typing import SuperLinkConnection
        from flwr.cli.utils import init_http_client_from_connection

        conn = SuperLinkConnection(name="fedhv-local", address=f"127.0.0.1:{port}",
                                   insecure=root_certificates is None, root_certificates=root_certificates)
        client = init_http_client_from_connection(conn)
    try:
        yield client
    finally:
        client.close()


def start_run(port: int, app_dir: Path, root_certificates: str | None = None) -> int:
    """Submit the Flower app in ``app_dir`` (its ``pyproject.toml`` holds the run config); the run id.

    Raises
    ------
    FlowerRunError
        When the app's configuration is invalid or the SuperLink does not start the run.
    """
    with warnings.catch_warnings():  # flwr's typer / pathspec use warns of deprecations
        warnings.simplefilter("ignore", DeprecationWarning)
        from flwr.cli.build import build_fab_from_disk
        from flwr.cli.config_utils import load_and_validate
        from flwr.common.serde import fab_to_proto, user_config_to_proto
        from flwr.proto.control_pb2 import StartRunRequest  # type: ignore[attr-defined]
        from flwr.supercore.fab import Fab

        try:  # the components are imported by the ServerApp / ClientApps, not here
            load_and_validate(app_dir / "pyproject.toml", check_module=False)
        except ValueError as exc:  # flwr lists the problems one per line: keep the error to one line
            raise FlowerRunError(" ".join(line.strip() for line in str(exc).splitlines())) from None
        fab_bytes = build_fab_from_disk(app_dir)
    fab = Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})
    request = StartRunRequest(fab=fab_to_proto(fab), override_config=user_config_to_proto({}), federation="",
                              app_spec="")
    try:
        with control_client(port, root_certificates) as client:
            res = client.StartRun(request)
    except Exception as exc:  # noqa: BLE001 - any transport or API error: the run did not start
        raise FlowerRunError(f"the SuperLink on 127.0.0.1:{port} did not start the run: "
                             f"{type(exc).__name__}: {exc}") from None
    if not res.HasField("run_id"):
        raise FlowerRunError(f"the SuperLink on 127.0.0.1:{port} did not start the run"
                             + (f": {res.note}" if res.HasField("note") else ""))
    return int(res.run_id)


def run_status(port: int, run_id: int, root_certificates: str | None = None) -> str:
    """``status[:sub-status]`` of run ``run_id`` (``""`` when the SuperLink does not list it)."""
    from flwr.cli.ls import _display_one_run

    with control_client(port, root_certificates) as client, contextlib.redirect_stdout(io.StringIO()):
        rows = _display_one_run(client, run_id)
    return rows[0].status_text if rows else ""


def running_runs(port: int, root_certificates: str | None = None) -> list[int]:
    """Ids of the runs the SuperLink lists as running."""
    from flwr.cli.ls import _list_runs

    with control_client(port, root_certificates) as client, contextlib.redirect_stdout(io.StringIO()):
        return [int(r.run_id) for r in _list_runs(client) if r.status_text.startswith("running")]


def stop_run(port: int, run_id: int, root_certificates: str | None = None) -> bool:
    """Ask the SuperLink to stop run ``run_id`` (``flwr stop``); whether it accepted."""
    from flwr.proto.control_pb2 import StopRunRequest  # type: ignore[attr-defined]

    with control_client(port, root_certificates) as client:
        return bool(client.StopRun(request=StopRunRequest(run_id=int(run_id))).success)
