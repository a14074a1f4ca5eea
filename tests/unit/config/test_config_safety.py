"""Config loader safety: ``--set`` tables merge like ``extends``, over-deep and non-UTF-8 input
gives one-line errors, seeds are refused outside the range the random streams use, and
``extends`` resolves against the including file with cycles named in full."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fedhv.config import load_config
from fedhv.config.loader import load_setting
from fedhv.errors import ConfigError

from helpers import cli as fedhv  # fedhv.cli.main in this process


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]


def test_set_table_value_is_deep_merged_like_extends(tmp_path: Path) -> None:
    over = load_config("mnist-fmnist", ["train={local_steps=2}", "lr={fedhv={global=2.0}}"])
    assert over.train.local_steps == 2
    # the rest of the preset's [train] and [lr.fedhv] tables is kept (was reset to the defaults: 32, 20)
    assert (over.train.batch_size, over.train.clients_per_round, over.partition.alpha) == (128, 10, 0.30)
    assert (over.lr["fedhv"].global_, over.lr["fedhv"].local) == (2.0, 0.3)
    assert set(over.lr) == {"uniform", "fsmgda", "fedcmoo", "fedhv", "fedcmoo-pref"}
    (tmp_path / "mine.toml").write_text('extends = "mnist-fmnist"\nsetting = "mnist-fmnist"\n'
                                        "[train]\nlocal_steps = 2\n[lr.fedhv]\nglobal = 2.0\n")
    assert load_config(str(tmp_path / "mine.toml")) == over


@pytest.mark.parametrize(("key", "value"), [
    ("a", "[" * 1000 + "]" * 1000),  # RecursionError in the TOML parser before
    ("a", "{a=" * 1000 + "1" + "}" * 1000),
    ("calibration.seeds", "[" * 300 + "]" * 300),  # parsed, then echoed whole in a 660-character error
], ids=["array-1000", "table-1000", "array-300"])
def test_deeply_nested_set_value_is_a_one_line_error(key: str, value: str) -> None:
    proc = fedhv("show-config", "multimnist", "--set", f"{key}={value}")
    assert_one_line_error(proc, f"--set {key}=", "levels deep")
    assert len(proc.stderr) < 300  # the value is shortened, not echoed


def test_deeply_nested_toml_file_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "deep.toml").write_text("x = " + "[" * 2000 + "]" * 2000 + "\n")
    assert_one_line_error(fedhv("show-config", str(tmp_path / "deep.toml")), "deep.toml", "levels deep")


def test_non_utf8_setting_and_extends_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "latin.toml").write_bytes(b'extends = "multimnist"\n# caf\xe9\nrounds = 3\n')
    (tmp_path / "child.toml").write_text('extends = "latin.toml"\n')
    for name in ("latin.toml", "child.toml"):
        assert_one_line_error(fedhv("show-config", str(tmp_path / name)), "latin.toml is not UTF-8", "line 2")
    # a --set value with a non-UTF-8 byte (argv decodes it to a lone surrogate) could not be written to config.toml
    assert_one_line_error(fedhv("show-config", "multimnist", "--set", "data.root=caf\udce9"), "--set", "not valid UTF-8")


SEED_CASES = [
    ("seed", 2**32), ("seed", 2**40), ("partition.seed", -1), ("partition.seed", 2**32),
    ("data.pair_seed", -7), ("data.pair_seed", 2**32 + 5), ("data.val_seed", -1), ("data.val_seed", 2**33),
]


@pytest.mark.parametrize(("key", "value"), SEED_CASES)
def test_seeds_outside_the_32_bit_stream_range_are_refused(key: str, value: int) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("multimnist", [f"{key}={value}"])
    message = str(info.value)
    assert message.startswith(f"{key} = {value} ") and "[0, 2**32 - 1 = 4294967295]" in message
    assert f"equal seed {value % 2**32}" in message  # names the seed it would have aliased
    assert load_config("multimnist", [f"{key}={2**32 - 1}"])  # the top of the range is fine


@pytest.mark.parametrize("seeds", ["[0, -1]", "[4294967296]"])
def test_calibration_seeds_outside_the_range_are_refused(seeds: str) -> None:
    proc = fedhv("show-config", "multimnist", "--set", f"calibration.seeds={seeds}")
    assert_one_line_error(proc, "calibration.seeds[", "out of range", "4294967295")


def test_extends_resolves_against_the_including_file(tmp_path: Path) -> None:
    (tmp_path / "cfg" / "inner").mkdir(parents=True)
    (tmp_path / "cfg" / "base.toml").write_text('extends = "mnist-fmnist"\nrounds = 7\n')
    (tmp_path / "cfg" / "inner" / "mid.toml").write_text('extends = "../base.toml"\n[train]\nlocal_steps = 4\n')
    (tmp_path / "cfg" / "child.toml").write_text('extends = "inner/mid.toml"\nseed = 3\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = fedhv("show-config", str(tmp_path / "cfg" / "child.toml"), cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert "rounds = 7\n" in proc.stdout and "seed = 3\n" in proc.stdout and "local_steps = 4\n" in proc.stdout
    assert "batch_size = 128\n" in proc.stdout  # from the preset at the bottom of the chain


def test_extends_cycle_names_every_file(tmp_path: Path) -> None:
    for name, base in (("a", "b"), ("b", "c"), ("c", "a")):
        (tmp_path / f"{name}.toml").write_text(f'extends = "{base}.toml"\n')
    (tmp_path / "top.toml").write_text('extends = "./b.toml"\n')
    with pytest.raises(ConfigError) as info:
        load_setting(str(tmp_path / "top.toml"))
    message = str(info.value)
    files = [str(tmp_path / f"{n}.toml") for n in ("b", "c", "a", "b")]
    assert message.startswith("extends cycle: " + " -> ".join(files)), message
    assert "top.toml" not in message  # the file that leads into the cycle is not part of it
