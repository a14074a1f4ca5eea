from __future__ import annotations

from pathlib import Path

import pytest

from fedhv.config import dumps, load_config, preset_names, to_dict
from fedhv.config.loader import config_from_toml_text
from fedhv.errors import ConfigError


def test_presets_follow_paper_tables() -> None:
    assert {"multimnist", "mnist-fmnist"} <= set(preset_names())
    mm = load_config("multimnist")
    assert (mm.partition.clients, mm.train.clients_per_round, mm.partition.samples_per_client) == (30, 20, 600)
    assert (mm.partition.alpha, mm.rounds, mm.train.batch_size, mm.train.local_steps) == (0.15, 200, 32, 10)
    assert (mm.lr_global, mm.lr_local) == (1.2, 0.3)  # Table 5, FedHV
    uni = load_config("multimnist", ["method=uniform"])
    assert (uni.lr_global, uni.lr_local) == (1.0, 0.3)
    mf = load_config("mnist-fmnist")
    assert (mf.partition.alpha, mf.train.clients_per_round, mf.partition.samples_per_client) == (0.3, 10, 500)
    assert (mf.rounds, mf.train.batch_size, mf.lr_global, mf.lr_local) == (500, 128, 1.6, 0.3)


def test_explicit_learning_rates_override_the_table() -> None:
    cfg = load_config("multimnist", ["train.lr_local=0.05"])
    assert (cfg.lr_global, cfg.lr_local) == (1.2, 0.05)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.lr_globl=1", "did you mean 'train.lr_global'"),
        ("rounsd=3", "did you mean 'rounds'"),
        ("fedhv.rho_clp=1", "did you mean 'fedhv.rho_clip'"),
    ],
)
def test_unknown_keys_get_a_suggestion(override: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config("multimnist", [override])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("fedhv.rho_clip=0", "fedhv.rho_clip = 0.0 must be > 0"),
        ("fedhv.rho_clip=-1e-6", "fedhv.rho_clip"),
        ("train.local_steps=0", "train.local_steps = 0"),
        ("partition.alpha=0", "partition.alpha"),
        ("train.clients_per_round=40", "train.clients_per_round = 40"),
        ("train.lr_local=-0.1", "train.lr_local"),
        ("train.local_steps='ten'", "wrong type; expected int"),
        ("fedhv.reference=[2.0, -1.0]", r"fedhv.reference\[1\] = -1.0 gives a non-positive slack"),
        ("fedhv.report_batches='some'", "report_batches"),
        ("method=sgd", "method = 'sgd' is not supported"),
    ],
)
def test_bad_values_name_parameter_and_fix(override: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config("multimnist", [override])


def test_unknown_setting_suggests_preset() -> None:
    with pytest.raises(ConfigError, match="did you mean 'multimnist'"):
        load_config("multimnsit")


def test_resolved_config_round_trips_through_toml() -> None:
    cfg = load_config("mnist-fmnist", ["method=uniform", "fedhv.reference=[2.5, 2.5]", "eval.splits=['val','test']"])
    again = config_from_toml_text(dumps(to_dict(cfg)))
    assert again == cfg


def test_toml_file_can_extend_a_preset(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('extends = "multimnist"\nrounds = 7\n[train]\nlocal_steps = 4\n')
    cfg = load_config(str(path))
    assert (cfg.rounds, cfg.train.local_steps, cfg.train.batch_size, cfg.setting) == (7, 4, 32, "mine")


def test_bad_toml_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("rounds = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(path))


def test_a_set_of_several_lines_is_parsed_whole_as_the_apps_set(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 52: ``--set $'a=1\\nb=2'`` kept ``a`` and dropped ``b`` without a word. An item holding new lines is TOML
    statements parsed whole, as the Flower App's ``set=``: every line applies, or an error applies none."""
    from fedhv.cli import main

    cfg = load_config("multimnist", ["train.local_steps=3\ntrain.batch_size=16", "rounds=4\r\nseed=9"])
    assert (cfg.train.local_steps, cfg.train.batch_size, cfg.rounds, cfg.seed) == (3, 16, 4, 9)
    cfg = load_config("multimnist", ["fedhv.reference = [\n  2.5,\n  2.6,\n]"])  # one value over lines: TOML
    assert cfg.fedhv.reference == (2.5, 2.6) or list(cfg.fedhv.reference) == [2.5, 2.6]  # type: ignore[arg-type]
    for bad, names in (("train.local_steps=3\ntrain.local_steps=4", "nothing was applied"),
                       ("train.local_steps=3\ndata.benchmark=pkg.mod:make", "nothing was applied")):
        with pytest.raises(ConfigError, match=names) as err:
            load_config("multimnist", [bad])
        assert "\n" not in str(err.value)
    assert main(["show-config", "multimnist", "--set", "train.local_steps=3\ntrain.batch_size=16"]) == 0
    shown = capsys.readouterr().out
    assert "local_steps = 3" in shown and "batch_size = 16" in shown
