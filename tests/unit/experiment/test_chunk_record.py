"""``environment.json["engine_chunk"]`` (and a resume's ``resumes.jsonl`` record) say how many
model copies the engine trained at once; ``summary.json`` stays machine-independent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedhv.experiment.runner import resume_experiment, run_experiment
from fedhv.results.rundir import read_jsonl

from helpers import small_config

pytestmark = pytest.mark.needs_data  # every test here reads the real data


def _chunk(tmp_path: Path, *overrides: str) -> dict:
    out = tmp_path / "run"
    run_experiment(small_config("rounds=1", 'method="uniform"', *overrides), out, progress=False)
    assert "engine_chunk" not in json.loads((out / "summary.json").read_text())
    return json.loads((out / "environment.json").read_text())["engine_chunk"]


def test_auto_chunk_is_recorded_with_its_numbers(tmp_path: Path) -> None:
    got = _chunk(tmp_path, 'engine="batched"', 'engine_chunk="auto"')
    assert got["auto"] is True and got["splits_round"] is False
    # the recorded numbers are the ones the choice came from: c = max(1, floor(fraction * A / b))
    assert got["chunk"] == max(1, int(got["fraction"] * got["available_bytes"] // got["copy_bytes"]))
    assert got["chunk"] >= 4 and 0 < got["copy_bytes"] < got["available_bytes"]


def test_fixed_chunk_and_sequential_engine(tmp_path: Path) -> None:
    assert _chunk(tmp_path / "a", 'engine="batched"', "engine_chunk=3") == {"auto": False, "chunk": 3}
    assert _chunk(tmp_path / "b", 'engine="sequential"') == {"auto": False, "chunk": 1}


def test_a_resume_records_its_own_chunking(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_experiment(small_config("rounds=1", 'method="uniform"', "engine_chunk=2"), out, progress=False)
    (out / "summary.json").unlink()  # as if stopped before the end; resume re-runs from round 0
    (out / "rounds.jsonl").write_text("")
    resume_experiment(out, progress=False)
    (record,) = read_jsonl(out / "resumes.jsonl")
    assert record["engine_chunk"] == {"auto": False, "chunk": 2} and record["round"] == 0
