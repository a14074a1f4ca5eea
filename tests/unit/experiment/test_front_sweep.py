"""Front sweeps (``fedhv grid --front``): the directions, each method's aim, FedHV's reference along a
direction, and the refusals before any run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedhv.algorithms.fedhv import FedHVConfig, calibrated_reference
from fedhv.cli import main
from fedhv.errors import ConfigError
from fedhv.experiment.calibration import CalibrationResult
from fedhv.experiment.grid_front import check_margins, parse_directions, plan_front


def _two(*_: object) -> int:
    return 2


def test_the_interior_lattice_has_das_dennis_counts_and_positive_directions() -> None:
    for m, h, count in ((2, 4, 5), (2, 1, 2), (3, 2, 6), (5, 3, 35)):
        dirs = np.asarray(parse_directions(str(h), m))
        assert dirs.shape == (math.comb(h + m - 1, m - 1), m) == (count, m)
        assert (dirs > 0).all() and np.allclose(dirs.sum(1), 1.0, atol=1e-15)
        assert len({tuple(d) for d in dirs}) == count
        # (k + 1) / (h + m) for the lattice's k: every entry a multiple of 1/(h + m)
        assert np.allclose(dirs * (h + m), np.round(dirs * (h + m)), atol=1e-12)
    assert parse_directions("4", 2)[2] == (0.5, 0.5)  # an even H holds the paper's direction
    assert parse_directions("uniform", 4) == [(0.25,) * 4]
    assert parse_directions("1,3; 2,2", 2) == [(0.25, 0.75), (0.5, 0.5)]


@pytest.mark.parametrize(("spec", "m", "names"), [
    ("0", 2, "H >= 1"), ("-2", 2, "H >= 1"), ("1,0", 2, "every entry > 0"), ("0.5,-0.5", 2, "every entry > 0"),
    ("1,2,3", 2, "3 entries for 2 tasks"), ("a,b", 2, "give H"), ("nan,1", 2, "every entry > 0"),
])
def test_a_direction_that_cannot_serve_is_refused(spec: str, m: int, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        parse_directions(spec, m)


def test_margins_must_keep_the_reference_above_the_calibration_maximum() -> None:
    assert check_margins([0.15, 0.3, 0.15]) == (0.15, 0.3)
    for bad in ([0.0], [-0.1], [float("inf")], []):
        with pytest.raises(ConfigError, match="margin"):
            check_margins(bad)


def _calibration(margin: float = 0.15) -> CalibrationResult:
    peak = [2.0, 0.5, 1.25]
    return CalibrationResult([p + margin for p in peak], peak, margin, [0], {"0": [[1.5, 0.4, 1.0], peak]})


def test_fedhvs_reference_along_a_direction_is_the_calibration_maximum_plus_delta_m_u() -> None:
    cal = _calibration()
    u = np.array([1.0, 2.0, 5.0])
    for delta in (0.05, 0.3, 3.0):
        want = np.array([2.0, 0.5, 1.25]) + delta * 3 * u / u.sum()
        np.testing.assert_allclose(calibrated_reference(cal, delta, tuple(u)), want, rtol=0, atol=1e-15)
    # the paper's direction: the calibration's own reference (bit for bit), or max + delta for another margin
    assert calibrated_reference(cal, 0.15).tolist() == cal.reference
    np.testing.assert_allclose(calibrated_reference(cal, 1.0), [3.0, 1.5, 2.25], rtol=0, atol=1e-15)
    with pytest.raises(ConfigError, match="2 values but the calibration has 3 tasks"):
        calibrated_reference(cal, 0.15, (0.5, 0.5))
    with pytest.raises(ConfigError, match="fedhv.direction"):
        calibrated_reference(cal, 0.15, (0.5, 0.0, 0.5))
    with pytest.raises(ConfigError, match="fedhv.direction = \\[1.0, 1.0\\] aims a calibrated reference"):
        FedHVConfig(reference=(3.0, 3.0), direction=(1.0, 1.0)).check()


def test_each_method_is_aimed_at_the_same_directions(tmp_path: Path) -> None:
    jobs, cals = plan_front(["multimnist"], ["fedhv", "linear", "fedcmoo-pref"], [0, 1], tmp_path, (), "1,3;1,1",
                            (0.15, 0.3), num_tasks=_two)
    assert len(jobs) == 2 * (2 + 1 + 1) * 2 and len(cals) == 1  # one calibration for every margin and direction
    by_dir: dict[str, dict[str, tuple[str, ...]]] = {}
    for job in jobs:
        rel = Path(job.run_dir).relative_to(tmp_path)
        assert rel.parts[:2] == ("multimnist", "front") and rel.name == f"s{job.seed}" and job.ablation == "front"
        by_dir.setdefault(rel.parts[2], {})["/".join(rel.parts[3:-1])] = job.overrides
        assert job.variant is not None and job.variant[0] == "front"
    assert sorted(by_dir) == ["u=0.25,0.75", "u=0.5,0.5"]
    aimed = by_dir["u=0.25,0.75"]
    assert sorted(aimed) == ["fedcmoo-pref", "linear", "margin=0.15/fedhv", "margin=0.3/fedhv"]
    assert "fedhv.direction=[0.25, 0.75]" in aimed["margin=0.3/fedhv"]
    assert "calibration.margin=0.3" in aimed["margin=0.3/fedhv"]

    def values(overrides: tuple[str, ...], key: str) -> list[float]:
        return json.loads(next(o for o in overrides if o.startswith(key + "=")).split("=", 1)[1])

    np.testing.assert_allclose(values(aimed["linear"], "linear.weights"), [0.75, 0.25], rtol=0, atol=1e-15)  # ∝ 1/u
    np.testing.assert_allclose(values(aimed["fedcmoo-pref"], "fedcmoo-pref.preference"), [1.5, 0.5], rtol=0,
                               atol=1e-15)  # m (1/u) / sum(1/u)
    np.testing.assert_allclose(values(by_dir["u=0.5,0.5"]["fedcmoo-pref"], "fedcmoo-pref.preference"), [1.0, 1.0])


@pytest.mark.needs_data
def test_a_method_that_takes_no_direction_is_refused_before_any_run(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="uniform, fsmgda take\\(s\\) no direction.*fedcmoo-pref, fedhv, linear"):
        plan_front(["multimnist"], ["uniform", "fsmgda", "fedhv"], [0], tmp_path, num_tasks=_two)
    out = tmp_path / "g"
    assert main(["grid", "multimnist", "--front", "1,0", "--out", str(out), "--quiet"]) == 2
    assert "every entry > 0" in capsys.readouterr().err
    assert main(["grid", "multimnist", "--front", "2", "--margins", "0.15,0", "--out", str(out), "--quiet"]) == 2
    assert "--margins 0.0: a margin must be > 0" in capsys.readouterr().err
    assert main(["grid", "multimnist", "--front", "2", "--ablation", "local-steps", "--out", str(out)]) == 2
    assert "--front and --ablation" in capsys.readouterr().err
    assert main(["grid", "multimnist", "--margins", "0.3", "--out", str(out)]) == 2
    assert "--margins: only with --front" in capsys.readouterr().err
    assert not out.exists()


def test_a_user_benchmark_named_as_module_attribute_gets_its_front(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """m comes from the user's tasks (the front path once looked the name up among the built-ins only)."""
    example = Path(__file__).resolve().parents[3] / "examples" / "user_benchmark"
    monkeypatch.syspath_prepend(str(example))
    jobs, calibrations = plan_front([str(example / "config.toml")], ["fedhv", "linear"], [0], tmp_path, (), "2",
                                    (0.15,))
    aims = sorted(Path(j.run_dir).relative_to(tmp_path).parts[2] for j in jobs if "linear" in j.run_dir)
    assert aims == ["u=0.25,0.75", "u=0.5,0.5", "u=0.75,0.25"]  # H = 2, m = 2: (k + 1) / 4
    assert len(jobs) == 3 * 2 and len(calibrations) == 1


def test_two_directions_never_share_a_folder_and_a_repeated_one_runs_once(tmp_path: Path) -> None:
    """Issue 52: folder names kept 4 significant digits, so 0.50001,0.49999 and 0.5,0.5 shared ``u=0.5,0.5`` (the
    second overwrote the first's grid-job.json); a direction given twice (also as 2,2) was planned twice."""
    spec = "0.50001,0.49999;0.5,0.5;1,1;2,2;0.25,0.75"
    assert parse_directions(spec, 2) == [(0.50001, 0.49999), (0.5, 0.5), (0.25, 0.75)]
    jobs, _ = plan_front(["multimnist"], ["fedhv", "linear"], [0], tmp_path, (), spec, (0.15, 0.150001),
                         num_tasks=_two)
    dirs = [j.run_dir for j in jobs]
    assert len(dirs) == len(set(dirs)) == 3 * (2 + 1)
    # each folder name is its direction (and margin) exactly: read back, it is the job's variant
    for job in jobs:
        rel = Path(job.run_dir).relative_to(tmp_path).parts
        u = tuple(float(v) for v in rel[2].removeprefix("u=").split(","))
        assert job.variant is not None and job.variant[1][0] == u
        if job.method == "fedhv":
            assert float(rel[3].removeprefix("margin=")) == job.variant[1][1]
    # the directions of the lattice keep short names where 4 digits are exact
    assert {Path(j.run_dir).relative_to(tmp_path).parts[2] for j in jobs} >= {"u=0.5,0.5", "u=0.25,0.75"}
