"""The Flower App's run config (``flower-app/``, :mod:`fedhv.flower.app`): ``set`` is TOML, applied
whole or refused whole; a key that a run-config key gives cannot be overridden behind its back;
numbers are checked as ``fedhv`` checks them; ``out=`` / ``resume=`` are claimed and checked before
the handshake makes any node load data (the grid below fails the test if anything touches it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flower_support import needs_flwr

pytestmark = needs_flwr


def _options(**rc: Any) -> Any:
    from fedhv.flower.app import app_options

    return app_options(rc)


def _refused(match: str, **rc: Any) -> None:
    from fedhv.flower.federation import FlowerSetupError

    with pytest.raises(FlowerSetupError, match=match):
        _options(**rc)


def test_every_override_of_set_is_applied() -> None:
    """``set="train.lr_local=0.01\\neval.test_period=5"``: before, the second override (after a new
    line) was dropped silently; both now reach the run's configuration."""
    from fedhv.flower.app import run_config_to_fedhv

    for text in ("train.lr_local=0.01\neval.test_period=5", "train.lr_local = 0.01; eval.test_period = 5 ;"):
        cfg = run_config_to_fedhv(_options(set=text, method="uniform"), 3)
        assert cfg.train.lr_local == 0.01 and cfg.eval.test_period == 5, text


def test_a_value_may_hold_any_character_toml_allows() -> None:
    from fedhv.flower.app import run_config_to_fedhv

    cfg = run_config_to_fedhv(_options(set="source = 'a;b # c'; eval.test_period = 5"), 3)
    assert cfg.source == "a;b # c" and cfg.eval.test_period == 5
    cfg = run_config_to_fedhv(_options(set='source = "x\\";\\ny" # a comment; eval.test_period = 4'), 3)
    assert cfg.source == 'x";\ny' and cfg.eval.test_period == 4


@pytest.mark.parametrize("text", ["eval.test_period = 5; source = 'abc", "eval.test_period=5; method_x = uniform",
                                  "eval.test_period = 5; eval.test_period = 6", "eval.test_period = 5; d = 1979-05-27"])
def test_a_toml_error_refuses_every_override(text: str) -> None:
    """Before, a value TOML could not parse was kept as text with its quotes (``'abc``) and the
    other overrides applied; now nothing is applied and one line says why."""
    _refused(r"run config set.*nothing was applied", set=text)


@pytest.mark.parametrize(("text", "key"), [("method='uniform'", "method"), ("seed=7", "seed"),
                                           ("partition.clients=5", "clients"), ("setting='x'", "setting")])
def test_set_naming_a_key_the_run_config_gives_is_an_error_naming_both(text: str, key: str) -> None:
    """Before, ``set="method='uniform'"`` and ``set="seed=7"`` were silently overridden by the app's own
    keys (the run was FedHV, seed 0)."""
    name = text.split("=")[0]
    _refused(rf"run config set names {name} and the run config key {key} .* give it once", set=text)


def test_set_rounds_conflicts_only_with_a_given_rounds() -> None:
    from fedhv.flower.app import run_config_to_fedhv

    assert run_config_to_fedhv(_options(set="rounds = 3", method="uniform"), 3).rounds == 3
    _refused(r"set names rounds and the run config key rounds \(= 2\)", set="rounds = 3", rounds=2)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("stage-timeout", float("nan"), r"stage-timeout = nan must be a number of seconds"),
    ("stage-timeout", float("inf"), r"stage-timeout = inf must be a number of seconds"),
    ("stage-timeout", -1.0, r"stage-timeout = -1.0 must be"),
    ("node-wait", float("nan"), r"node-wait = nan must be"),
    ("clients", 10**9, r"clients = 1000000000 must be an integer number of SuperNodes in \[1, 100000\]"),
    ("seed", 2**32, r"seed = 4294967296: expected int in \[0, 4294967295\]"),
    ("accept-changed-code", "yes", r"accept-changed-code = 'yes': expected true or false"),
    ("set", 5, r"set = 5: expected a string"),
])
def test_numbers_are_checked_as_fedhv_checks_them(key: str, value: object, match: str) -> None:
    _refused(match, **{key: value})


def test_the_cli_checks_stage_timeout_too() -> None:
    from helpers import cli

    done = cli("flower", "local", "--resume", "/nonexistent-run", "--stage-timeout", "nan")
    assert done.returncode == 2 and "--stage-timeout = nan must be a number of seconds" in done.stderr, done.stderr


class UntouchableGrid:
    """A grid that fails the test when the App uses it: ``out`` / ``resume`` must be checked first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the App used the grid ({name}) before checking out= / resume=")


def _serve(**rc: Any) -> dict[str, Any]:
    from fedhv.flower.app import serve_app

    return serve_app(UntouchableGrid(), {"clients": 3, "set": "eval.test_period = 1", "method": "uniform",
                                         "node-wait": 1.0, **rc})


def test_a_busy_or_finished_out_is_refused_before_the_handshake(tmp_path: Path) -> None:
    from fedhv.results.rundir import RunDir, RunDirBusy, RunDirError

    busy = tmp_path / "busy"
    busy.mkdir()
    with RunDir(busy), pytest.raises(RunDirBusy, match="in use by another fedhv process"):
        _serve(out=str(busy))
    done = tmp_path / "done"
    done.mkdir()
    (done / "summary.json").write_text("{}")
    with pytest.raises(RunDirError, match="already holds a finished run"):
        _serve(out=str(done))
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(Exception, match="is a symbolic link"):
        _serve(out=str(tmp_path / "link"))
    assert not (real / ".lock").exists()


def _run_dir(path: Path) -> Path:
    from fedhv.config import dumps, load_config, to_dict

    path.mkdir()
    cfg = load_config("multimnist", ["partition.clients=3", "train.clients_per_round=2"])
    (path / "config.toml").write_text(dumps(to_dict(cfg)))
    return path


def test_a_bad_resume_is_refused_before_the_handshake(tmp_path: Path) -> None:
    from fedhv.flower.federation import FlowerSetupError
    from fedhv.results.rundir import RunDir, RunDirBusy, RunDirError

    with pytest.raises(FlowerSetupError, match="is not a directory"):
        _serve(resume=str(tmp_path / "missing"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FlowerSetupError, match="is not a directory"):
        _serve(resume=str(fifo))
    run = _run_dir(tmp_path / "run")
    (tmp_path / "run-link").symlink_to(run)
    with pytest.raises(FlowerSetupError, match="is a symbolic link"):
        _serve(resume=str(tmp_path / "run-link"))
    with RunDir(run), pytest.raises(RunDirBusy):
        _serve(resume=str(run))
    linked = _run_dir(tmp_path / "linked")
    elsewhere = tmp_path / "elsewhere.toml"
    (linked / "config.toml").rename(elsewhere)
    (linked / "config.toml").symlink_to(elsewhere)
    with pytest.raises(RunDirError, match=r"config.toml is a symbolic link"):
        _serve(resume=str(linked))


def test_a_finished_resume_does_no_node_work(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    (run / "summary.json").write_text('{"mean_acc": 1.5}')
    assert _serve(resume=str(run)) == {"mean_acc": 1.5, "run_dir": str(run)}
    from fedhv.results.rundir import RunDir

    RunDir(run).close()  # the App let go of its lock


def test_read_run_config_refuses_links_fifos_and_devices(tmp_path: Path) -> None:
    from fedhv.flower.procs import FlowerRunError
    from fedhv.flower.runconf import read_run_config

    run = _run_dir(tmp_path / "run")
    assert "multimnist" in read_run_config(run)
    os.unlink(run / "config.toml")
    os.mkfifo(run / "config.toml")
    with pytest.raises(FlowerRunError, match="is not a regular file"):
        read_run_config(run)
    os.unlink(run / "config.toml")
    (run / "config.toml").symlink_to("/dev/zero")
    with pytest.raises(FlowerRunError, match="is a symbolic link"):
        read_run_config(run)


def test_a_run_config_over_a_mebibyte_is_read_whole(tmp_path: Path) -> None:
    """``read_run_config`` reads through ``safe_io.read_regular``: a 2 MiB ``config.toml`` (a long comment)
    comes back whole (it was cut at 1 MiB, so the tail of a large file was silently lost); 16 MiB is the bound."""
    from fedhv.flower.procs import FlowerRunError
    from fedhv.flower.runconf import read_run_config

    text = "# " + "x" * (2 << 20) + '\nsetting = "big"\n'
    (tmp_path / "config.toml").write_text(text)
    assert read_run_config(tmp_path) == text
    (tmp_path / "config.toml").write_text("#" * (17 << 20))
    with pytest.raises(FlowerRunError, match="larger than"):
        read_run_config(tmp_path)
