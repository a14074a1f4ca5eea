"""``fedhv tune`` before any run (issue 50, item 2): search spaces, bad input, the objective, the chosen file.

- Every registered method declares a valid search space: its two learning rates (log-uniform around the
  setting's, 1/4 to 4 times) and its own hyper-parameters, with its section's default and the paper's or
  authors' values inside (FedHV's margin 0.15, DWA's T = 2, STCH's mu = 1, CAGrad's c = 0.4, FAMO's 0.025
  and its weight decays).
- Bad input is refused with one line naming the option, the value and the fix, before any run (no tune
  folder appears): empty and inverted ranges (given or declared), rounds and trials below the pruner's
  rungs, unknown objectives, methods, pruners and range keys, two methods tuning one shared key.
- The objective reads the validation metrics only (the test metrics in the same entries differ).
- The chosen configuration is a TOML file the loader takes: each method gets its chosen values, the setting
  keeps its name (``fedhv table`` groups its runs with the setting's).
- A trial left running by a dead driver of this machine is failed and queued again with its parameters and
  run directory; one of another machine's driver is left alone (Optuna, a SQLite file); a folder holding
  another plan's tuning is refused.
- ``calibration.lr_*`` (the chosen configuration pins them): checked, refused on Flower where a node would not
  follow them, and a calibration runs at them, not at the run's rates.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import pytest

from fedhv.algorithms.tuning import LEARNING_RATES, Choice, Range, Rate, config_key
from fedhv.cli import main
from fedhv.config import load_config
from fedhv.config.schema import CalibrationConfig
from fedhv.experiment.tune_space import (
    Pruning,
    TuneError,
    TunePlan,
    check_plan,
    chosen_toml,
    method_space,
    objective_value,
    trial_configs,
)
from fedhv.registry import METHODS


def _default(method: str, key: str) -> object:
    if "." in key:
        head, rest = key.split(".", 1)
        assert head == "calibration", key
        return getattr(CalibrationConfig(), rest)
    return getattr(METHODS.get(method).section(), key)


@pytest.mark.parametrize("method", sorted(METHODS.names()))
def test_every_method_declares_a_valid_space_holding_its_defaults_and_the_authors_values(method: str) -> None:
    space = METHODS.get(method).search_space()
    assert space[:2] == LEARNING_RATES  # the base class's rates come first, for every method
    keys = [config_key(method, d) for d in space]
    assert len(keys) == len(set(keys)), keys
    for dim in space:
        dim.check(method)  # an empty, inverted or non-positive log range raises
        if isinstance(dim, Rate):
            assert dim.low <= 1.0 <= dim.high and (dim.low, dim.high) == (0.25, 4.0)
            continue
        assert dim.contains(_default(method, dim.key)), (method, dim, _default(method, dim.key))
        assert all(dim.contains(v) for v in dim.authors)


def test_the_named_methods_search_their_own_hyper_parameters_around_the_authors_values() -> None:
    def dims(method: str) -> dict[str, object]:
        return {d.key: d for d in METHODS.get(method).search_space() if not isinstance(d, Rate)}

    assert dims("fedhv")["calibration.margin"].authors == (0.15,)
    assert dims("dwa")["temperature"].authors == (2.0,)
    assert dims("stch")["mu"].authors == (1.0,)
    for name in ("fsmgda-cagrad", "fedcmoo-cagrad"):
        assert 0.4 in dims(name)["c"].authors
    famo = dims("famo")
    assert famo["lr"].authors == (0.025,) and isinstance(famo["weight_decay"], Choice)
    assert set(famo["weight_decay"].values) == {0.0, 1e-3, 1e-2}
    assert set(dims("fsmgda-aligned-mtl")["scale_mode"].values) == {"min", "median", "rmse"}


def test_learning_rates_are_searched_around_the_presets_rates() -> None:
    plan = TunePlan("multimnist", "multimnist", ("fedhv", "uniform", "stch", "fedcmoo-pref"), 4, 12)
    for method, cfg in trial_configs(plan).items():
        params = {p.name: p for p in method_space(cfg)}
        g, loc = params[f"lr.{method}.global"], params[f"lr.{method}.local"]
        assert g.log and g.default == cfg.lr_global and (g.low, g.high) == (cfg.lr_global / 4, cfg.lr_global * 4)
        assert loc.default == cfg.lr_local and loc.low == pytest.approx(cfg.lr_local / 4)
        assert all(p.contains(p.default) for p in params.values())
    fedhv = {p.name: p for p in method_space(trial_configs(plan)["fedhv"])}
    assert fedhv["lr.fedhv.global"].default == 1.2 and fedhv["calibration.margin"].default == 0.15


def _refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> str:
    out = tmp_path / "tune"
    assert main(["tune", "multimnist", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert not out.exists()  # refused before anything ran or was written
    return err


@pytest.mark.parametrize(("args", "says"), [
    (["--methods", "stch", "--range", "stch.mu=5:0.5"], r"stch\.mu = \[5\.0, 0\.5\] is inverted; give low < high"),
    (["--methods", "stch", "--range", "stch.mu=1:1"], r"stch\.mu = \[1\.0, 1\.0\] is empty"),
    (["--methods", "stch", "--range", "lr.global=0:2"], r"lr\.global = \[0\.0, 2\.0\] is log-uniform and needs low > 0"),
    (["--methods", "famo", "--range", "famo.weight_decay=0:1"], r"famo\.weight_decay is a choice"),
    (["--methods", "uniform", "--range", "stch.mu=0.1:1"], r"--range stch\.mu: no method of this tuning searches"),
    (["--methods", "uniform", "--rounds", "3"], r"--rounds 3 with eval\.test_period = 3: no validation evaluation"),
    (["--methods", "uniform", "--rounds", "6", "--first-rung", "6"], r"--first-rung 6 with --rounds 6"),
    (["--methods", "uniform", "--trials", "1"], r"--trials 1 with --pruner halving"),
    (["--methods", "uniform", "--trials", "3", "--pruner", "median"], r"--trials 3 with --pruner median and 3 startup"),
    (["--methods", "uniform", "--trials", "0"], r"--trials 0: give at least 1"),
    (["--methods", "uniform", "--objective", "accuracy"], r"--objective 'accuracy' is unknown; choose one of mean-worst"),
    (["--methods", "uniform", "--pruner", "asha"], r"--pruner 'asha' is unknown"),
    (["--methods", "uniform", "--window", "0"], r"--window 0"),
    (["--methods", "uniform,nosuch"], r"--methods: 'nosuch' is not a method; choose from"),
    (["--methods", "uniform", "--reduction", "1"], r"--reduction 1"),
    (["--methods", "uniform", "--range", "stch.mu"], r"--range 'stch.mu': give KEY=LOW:HIGH"),
    (["--methods", "uniform", "--address", "127.0.0.1:6379"], r"--address: only with --backend ray"),
    (["--methods", "uniform", "--set", "data.val_fraction=0"], r"data\.val_fraction = 0"),
])
def test_bad_input_is_refused_in_one_line_before_anything_runs(args: list[str], says: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import re

    err = _refused(capsys, tmp_path, *args)
    assert re.search(says, err), err


def test_a_methods_own_bad_declaration_and_a_shared_key_tuned_twice_are_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stch = METHODS.get("stch")
    monkeypatch.setattr(stch, "tuning", (Range("mu", 5.0, 0.5, log=True),))
    err = _refused(capsys, tmp_path, "--methods", "stch")
    assert "stch's search space: search range stch.mu = [5.0, 0.5] is inverted" in err
    monkeypatch.setattr(stch, "tuning", (Range("mu", 0.1, 2.0, authors=(3.0,)),))
    assert "leaves out the authors' value 3.0" in _refused(capsys, tmp_path, "--methods", "stch")
    monkeypatch.setattr(stch, "tuning", (Range("calibration.margin", 0.05, 0.5),))
    err = _refused(capsys, tmp_path, "--methods", "fedhv,stch")
    assert "fedhv and stch both tune calibration.margin" in err


def test_check_plan_fills_the_first_rung_at_an_evaluation() -> None:
    plan = TunePlan("multimnist", "multimnist", ("uniform",), 4, 12)
    checked = check_plan(plan, trial_configs(plan))
    assert checked.pruning.first_rung == 3  # ceil(12 / 9) = 2, the next evaluation (every 3 rounds) is round 3
    assert check_plan(dataclasses.replace(plan, pruning=Pruning("none")), trial_configs(plan)).pruning.kind == "none"
    with pytest.raises(TuneError, match="--first-rung 11 with --rounds 12 and eval.test_period = 3: no validation evaluation"):
        check_plan(dataclasses.replace(plan, pruning=Pruning(first_rung=11)), trial_configs(plan))


def test_the_objective_reads_the_validation_metrics_never_the_test_metrics() -> None:
    def entry(t: int, test: float, val: float) -> dict[str, object]:
        return {"round": t, "mean_acc": test, "worst_acc": test, "hv": test,
                "val": {"mean_acc": val, "worst_acc": val - 10, "hv": val / 100}}

    entries = [entry(t, test=99.0, val=float(t)) for t in range(1, 16)]
    # (MeanAcc + WorstAcc) / 2 = val - 5, averaged over the last ten validation evaluations (rounds 6..15)
    assert objective_value(entries, "mean-worst", 10) == pytest.approx(sum(t - 5 for t in range(6, 16)) / 10)
    assert objective_value(entries, "mean-acc", 3) == pytest.approx(14.0)
    assert objective_value(entries, "worst-acc", 1) == pytest.approx(5.0)
    assert objective_value(entries, "hv", 2) == pytest.approx(0.145)
    assert objective_value([{"round": 1, "mean_acc": 99.0, "worst_acc": 99.0}], "mean-worst", 10) is None
    with pytest.raises(TuneError, match="has no finite"):
        objective_value([{"round": 1, "val": {"mean_acc": None, "worst_acc": None}}], "mean-worst", 10)


def test_the_chosen_configuration_is_a_toml_file_the_loader_and_grid_take(tmp_path: Path) -> None:
    plan = TunePlan("multimnist", "multimnist", ("uniform", "stch", "fedhv"), 4, 12,
                    overrides=("train.local_steps=5",), pinned=("calibration.lr_global=1.2", "calibration.lr_local=0.3"))
    chosen = {"uniform": {"lr.uniform.global": 0.7, "lr.uniform.local": 0.21},
              "stch": {"lr.stch.global": 1.5, "lr.stch.local": 0.2, "stch.mu": 0.3},
              "fedhv": {"lr.fedhv.global": 0.9, "lr.fedhv.local": 0.4, "calibration.margin": 0.25}}
    path = tmp_path / "chosen.toml"
    path.write_text(chosen_toml(plan, chosen, ["a note"]))
    assert path.read_text().startswith("# a note\nextends = \"multimnist\"\nsetting = \"multimnist\"\n")
    for method, values in chosen.items():
        cfg = load_config(str(path), [f"method={json.dumps(method)}"])
        assert cfg.setting == "multimnist" and cfg.train.local_steps == 5 and cfg.rounds == 200
        assert (cfg.lr_global, cfg.lr_local) == (values[f"lr.{method}.global"], values[f"lr.{method}.local"])
        # FedHV's tuned rates do not move the calibration of the other calibrated methods (pinned)
        assert (cfg.calibration.lr_global, cfg.calibration.lr_local) == (1.2, 0.3)
    assert load_config(str(path), ["method=\"stch\""]).section("stch").mu == 0.3
    assert load_config(str(path), ["method=\"fedhv\""]).calibration.margin == 0.25


def test_a_trial_of_a_dead_driver_is_queued_again_and_another_machines_is_left_alone(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from fedhv.experiment.tune import OWNER, RUN_DIR, Tuner

    plan = check_plan(TunePlan("multimnist", "multimnist", ("uniform",), 3, 6), trial_configs(
        TunePlan("multimnist", "multimnist", ("uniform",), 3, 6)))
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    tuner = Tuner(plan, tmp_path, url)
    tuner.prepare()
    first, _ = tuner.ask("uniform")  # the setting's values, queued when the study was made
    assert first.params == {"lr.uniform.global": 1.0, "lr.uniform.local": 0.3}
    second, _ = tuner.ask("uniform")
    dead = os.fork()
    if dead == 0:  # a process that exits at once: a dead driver's PID on this machine
        os._exit(0)
    os.waitpid(dead, 0)
    first.set_user_attr(OWNER, f"{socket.gethostname()} {dead} None")
    second.set_user_attr(OWNER, "another-host 4242 17")
    again = Tuner(plan, tmp_path, url)
    again.prepare()
    study = again.studies["uniform"]
    states = {t.number: t.state.name for t in study.get_trials(deepcopy=False)}
    assert states == {0: "FAIL", 1: "RUNNING", 2: "WAITING"}
    assert again.remaining("uniform") == 3 - 1  # the other machine's running trial counts as under way
    requeued, spec = again.ask("uniform")
    assert requeued.number == 2 and requeued.params == first.params
    assert spec.job.run_dir == first.user_attrs[RUN_DIR] == str(tmp_path / "trials" / "uniform" / "t000")


def test_pinned_calibration_rates_are_checked_and_refused_where_a_node_cannot_follow_them() -> None:
    from fedhv.config.flower import refuse_on_flower
    from fedhv.errors import ConfigError

    with pytest.raises(ConfigError, match=r"calibration\.lr_local = -0\.1 must be > 0"):
        load_config("multimnist", ["calibration.lr_local=-0.1"])
    refuse_on_flower(load_config("multimnist", ["calibration.lr_local=0.3"]))  # the run's own: fine
    with pytest.raises(ConfigError, match=r"calibration\.lr_local = 0\.5: a SuperNode trains every stage"):
        refuse_on_flower(load_config("multimnist", ["calibration.lr_local=0.5"]))


@pytest.mark.needs_data
def test_a_calibration_runs_at_its_pinned_rates_not_the_runs() -> None:
    from fedhv.experiment.calibration import calibrate
    from fedhv.experiment.problem import Problem

    tiny = ["partition.clients=4", "partition.samples_per_client=32", "train.clients_per_round=2",
            "train.local_steps=2", "train.batch_size=16", "calibration.rounds=2", "dtype=\"float64\""]

    def reports(*overrides: str) -> list[list[float]]:
        cfg = load_config("multimnist", [*tiny, *overrides])
        return calibrate(cfg, Problem.of(cfg).data(cfg)).reports["0"]

    at_fedhv = reports("method=\"fedhv\"")  # the preset's [lr.fedhv]: 1.2 / 0.3
    pinned = reports("method=\"uniform\"", "train.lr_global=0.5", "train.lr_local=0.05",
                     "calibration.lr_global=1.2", "calibration.lr_local=0.3")
    assert pinned == at_fedhv
    assert reports("method=\"uniform\"", "train.lr_global=0.5", "train.lr_local=0.05") != at_fedhv


def test_a_folder_holding_another_plans_tuning_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from fedhv.experiment.tune import Tuner

    plan = TunePlan("multimnist", "multimnist", ("uniform",), 3, 6)
    Tuner(check_plan(plan, trial_configs(plan)), tmp_path, f"sqlite:///{tmp_path / 'optuna.db'}").prepare()
    other = dataclasses.replace(plan, rounds=9)
    with pytest.raises(TuneError, match=r"holds a tuning of another plan \(rounds 6 -> 9\); rerun it with its own"):
        Tuner(check_plan(other, trial_configs(other)), tmp_path, f"sqlite:///{tmp_path / 'optuna.db'}").prepare()
