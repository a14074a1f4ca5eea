"""``fedhv.flower.control.start_run`` without a deployment: its errors name what went wrong.

Starting runs on real SuperLinks is tested by every Flower test (``tests/e2e/flower/test_flower.py`` and
the others submit through it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flower_support import HAVE_FLWR

pytestmark = pytest.mark.skipif(not HAVE_FLWR, reason="the Flower back-end needs flwr: pip install -e '.[test,flower]'")


def test_no_superlink_on_the_port_is_a_one_line_error(tmp_path: Path) -> None:
    from fedhv.flower.control import start_run
    from fedhv.flower.local import app_pyproject
    from fedhv.flower.procs import FlowerRunError, free_ports

    (tmp_path / "pyproject.toml").write_text(app_pyproject({"config": "x.toml"}))
    port = free_ports(1)[0]  # nothing listens there
    with pytest.raises(FlowerRunError, match=rf"the SuperLink on 127\.0\.0\.1:{port} did not start the run: "):
        start_run(port, tmp_path)


def test_invalid_app_configuration_is_named_before_connecting(tmp_path: Path) -> None:
    from fedhv.flower.control import start_run
    from fedhv.flower.local import app_pyproject
    from fedhv.flower.procs import FlowerRunError, free_ports

    text = app_pyproject({"config": "x.toml"}).replace('serverapp = "fedhv.flower.app:server_app"\n', "")
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(FlowerRunError, match=r"Invalid Flower App configuration in .*pyproject\.toml.*"
                       r"Property \"serverapp\" missing") as err:
        start_run(free_ports(1)[0], tmp_path)
    assert "\n" not in str(err.value)
