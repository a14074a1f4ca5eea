"""One atomic write, one JSON writer, one config digest (issue 39, item 4).

``fedhv.safe_io.write_atomic`` is the only function that writes a file by temporary file +
fsync + rename; ``safe_io.write_json`` the only JSON writer. The run directory's and the
data cache's writers are it with their error policy, and the older names still work.
``experiment.checkpoint.config_digest`` is the only config digest, and its value for a
given ``config.toml`` text is the one old runs recorded (they must still resume).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from fedhv import safe_io
from fedhv.data import cache
from fedhv.results import rundir, runfiles


@pytest.mark.parametrize("content", [b"\x00bytes", "text \u00e9", lambda fh: fh.write(b"from a writer")])
def test_write_atomic_takes_bytes_text_or_a_writer(tmp_path: Path, content: object) -> None:
    path = tmp_path / "f"
    safe_io.write_atomic(path, content)  # type: ignore[arg-type]
    expected = content if isinstance(content, bytes) else (
        content.encode() if isinstance(content, str) else b"from a writer")
    assert path.read_bytes() == expected
    assert stat.S_IMODE(path.stat().st_mode) == safe_io.new_file_mode()
    assert os.listdir(tmp_path) == ["f"]  # no temporary file left


def test_write_atomic_mode_link_and_failure(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    safe_io.write_atomic(secret, b"k", mode=0o600, fsync_dir=True)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    target, link = tmp_path / "target", tmp_path / "link"
    target.write_bytes(b"old")
    link.symlink_to(target)
    with pytest.raises(safe_io.UnsafeFileError, match="symbolic link"):
        safe_io.write_atomic(link, b"new")
    safe_io.write_atomic(link, b"new", replace_link=True)  # the link itself is replaced, never written through
    assert target.read_bytes() == b"old" and not link.is_symlink() and link.read_bytes() == b"new"

    def fail(fh: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        safe_io.write_atomic(secret, fail)
    assert secret.read_bytes() == b"k" and sorted(os.listdir(tmp_path)) == ["link", "secret", "target"]


def test_one_json_writer_strict_and_in_one_format(tmp_path: Path) -> None:
    data = {"b": 1.5, "a": [float("nan"), float("inf"), (1, 2)], "n": None}
    text = '{\n  "b": 1.5,\n  "a": [\n    null,\n    null,\n    [\n      1,\n      2\n    ]\n  ],\n  "n": null\n}\n'
    safe_io.write_json(tmp_path / "one.json", data)
    runfiles.write_json(tmp_path / "run.json", data)
    rundir.write_json(tmp_path / "rundir.json", data)
    assert cache.write_json(tmp_path / "sub" / "cache.json", data)
    for name in ("one.json", "run.json", "rundir.json", "sub/cache.json"):
        assert (tmp_path / name).read_text() == text, name  # strict (no NaN token), key order kept, final newline
    safe_io.write_json(tmp_path / "default.json", {"p": tmp_path}, default=str)
    assert json.loads((tmp_path / "default.json").read_text()) == {"p": str(tmp_path)}


def test_the_wrappers_keep_their_error_policy(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "folder" / "f.json"
    with pytest.raises(rundir.RunDirError, match="cannot write"):
        runfiles.write_json(missing, {})
    (tmp_path / "file").write_text("x")
    assert cache.write_json(tmp_path / "file" / "c.json", {}) is False  # a cache that cannot be written: no raise


def test_older_names_are_the_one_writer() -> None:
    assert runfiles.write_atomic_with is runfiles.write_atomic
    assert rundir.write_atomic is runfiles.write_atomic and rundir.write_json is runfiles.write_json


def test_one_config_digest_reproduces_the_recorded_value() -> None:
    from fedhv.experiment.checkpoint import config_digest

    text = 'rounds = 2\nmethod = "fedhv"\n\n[data]\nbenchmark = "multimnist"\n'
    # The value fedhv wrote into checkpoints (config_sha256) and node maps for this text before the
    # two digests became one: a resumed old run compares against it.
    assert config_digest(text) == "83a51a6cc0f87d62381500b0ba035b5d8878c21db82d9346f06799fa203ffe53"
    assert config_digest(text) == hashlib.sha256(text.encode()).hexdigest()


def test_the_flower_nodes_name_a_run_by_the_same_digest() -> None:
    from fedhv.experiment.checkpoint import config_digest
    from fedhv.flower.node import config_sha

    assert config_sha is config_digest
