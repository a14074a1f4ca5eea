"""``fedhv grid --out`` on a folder that cannot be written -- a read-only or full file system, a path through a
file -- is one ``error:`` line naming the folder and the cause (issue 52: a raw ``OSError`` from the driver lock),
before any run starts."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from fedhv.cli import main
from fedhv.experiment import grid_lock


def _fail(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@pytest.mark.parametrize("case", ["read-only-mkdir", "read-only-open", "full", "through-a-file"])
def test_an_unwritable_grid_folder_is_one_line(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grid"
    if case == "read-only-mkdir":  # a missing --out on a read-only file system
        real = Path.mkdir

        def mkdir(self: Path, *args: object, **kwargs: object) -> None:
            if self == out:
                raise _fail(errno.EROFS)
            real(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Path, "mkdir", mkdir)
    elif case == "read-only-open":  # an existing --out on a read-only file system: the lock file cannot be made
        out.mkdir()
        monkeypatch.setattr(grid_lock, "open_nofollow", lambda *a, **k: (_ for _ in ()).throw(_fail(errno.EROFS)))
    elif case == "full":  # the lock file is made, its PID line cannot be written
        monkeypatch.setattr(grid_lock.os, "pwrite", lambda *a, **k: (_ for _ in ()).throw(_fail(errno.ENOSPC)))
    else:
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "grid"
    assert main(["grid", "multimnist", "--out", str(out), "--rounds", "1", "--seeds", "0", "--quiet"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --out {out}: cannot write the grid folder"), lines
    want = {"read-only-mkdir": "Read-only file system", "read-only-open": "Read-only file system",
            "full": "No space left on device", "through-a-file": "Not a directory"}[case]
    assert want in lines[0], lines
    assert not list(out.glob("*/*")) if out.is_dir() else True  # no run started
