"""Only regular files are read or written (fedhv.safe_io, docs/security.md "Files").

Real files on disk: a FIFO and a link to ``/dev/zero`` in a data root (CIFAR-10 image-folder and
CelebA layouts), a link out of the data root, links planted in output folders (``fedhv table
--out``, ``fedhv plot``, the node files of ``fedhv flower export``), a hard link into a run
directory that is resumed. Every read that could hang or exhaust memory runs in a child process
with a timeout and an address-space limit (``RLIMIT_AS``), so a regression fails the test
instead of freezing the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from celeba_fixture import make_celeba

from conftest import SMALL

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
#: Address-space limit of the child processes (the machine is shared: never more than a few GB).
LIMIT_BYTES = 3 << 30
TIMEOUT_S = 60


def _cifar_folder(root: Path) -> Path:
    """A tiny CIFAR-10 image folder (one PNG per class and split) under ``root/cifar10``."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for cls in CLASSES:
            (root / "cifar10" / split / cls).mkdir(parents=True)
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                root / "cifar10" / split / cls / "0000.png")
    return root / "cifar10" / "train" / "cat" / "0000.png"


def _load_in_child(call: str, root: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """Run ``call`` (a loader call on ``root``) in a child with RLIMIT_AS and a timeout; it prints
    ``error: MESSAGE`` for a fedhv error and ``loaded`` on success."""
    code = textwrap.dedent(f"""
        import resource, sys, warnings
        warnings.simplefilter("ignore")  # the CelebA subset warning; the error line is what is checked
        resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_BYTES}, {LIMIT_BYTES}))
        from fedhv.errors import FedHVError
        from fedhv.data.cifar import load_cifar10
        from fedhv.data.celeba import load_celeba
        from fedhv.data.idx import load_mnist
        try:
            {call}
        except FedHVError as exc:
            print("error: " + str(exc), file=sys.stderr)
            sys.exit(2)
        print("loaded")
    """)
    env = {**os.environ, "FEDHV_CACHE": str(cache)}
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S,
                              env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{call} did not return within {TIMEOUT_S} s (a FIFO or a device read without bound)")


def _one_line_naming(proc: subprocess.CompletedProcess[str], path: Path, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0], proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("layout", ["cifar-folder", "celeba", "mnist"])
def test_a_fifo_in_the_data_root_is_refused_at_once(tmp_path: Path, layout: str, data_root: Path) -> None:
    root = tmp_path / "data"
    if layout == "mnist":
        shutil.copytree(data_root / "mnist", root / "mnist")
        entry, call = root / "mnist" / "t10k-labels-idx1-ubyte.gz", f"load_mnist({str(root)!r}, download=False)"
    elif layout == "cifar-folder":
        entry, call = _cifar_folder(root), f"load_cifar10({str(root)!r}, download=False)"
    else:
        make_celeba(root / "celeba", n=20)
        entry, call = root / "celeba" / "img_align_celeba" / "000003.jpg", f"load_celeba({str(root)!r})"
    entry.unlink()
    os.mkfifo(entry)
    proc = _load_in_child(call, root, tmp_path / "cache")
    _one_line_naming(proc, entry, "FIFO")


@pytest.mark.parametrize("layout", ["cifar-folder", "celeba"])
def test_a_link_to_dev_zero_is_refused_without_reading_it(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "data"
    if layout == "cifar-folder":
        entry, call = _cifar_folder(root), f"load_cifar10({str(root)!r}, download=False)"
    else:
        make_celeba(root / "celeba", n=20)
        entry, call = root / "celeba" / "img_align_celeba" / "000003.jpg", f"load_celeba({str(root)!r})"
    entry.unlink()
    entry.symlink_to("/dev/zero")
    proc = _load_in_child(call, root, tmp_path / "cache")
    _one_line_naming(proc, entry, "/dev/zero")


def test_a_link_out_of_the_data_root_is_refused_and_one_inside_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "data"
    entry = _cifar_folder(root)
    outside = tmp_path / "elsewhere.png"
    shutil.copy(entry, outside)
    entry.unlink()
    entry.symlink_to(outside)
    proc = _load_in_child(f"load_cifar10({str(root)!r}, download=False)", root, tmp_path / "cache")
    _one_line_naming(proc, entry, "out of the data root")

    entry.unlink()
    entry.symlink_to(root / "cifar10" / "test" / "cat" / "0000.png")  # inside the root: an operator's layout
    proc = _load_in_child(f"load_cifar10({str(root)!r}, download=False)", root, tmp_path / "cache")
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-2000:]


def test_an_oversized_image_is_refused_by_name(tmp_path: Path) -> None:
    from fedhv.data import files

    bound = getattr(files, "MAX_IMAGE_BYTES", 16 << 20)  # 16 MiB (the attribute is new: the old code had no bound)
    root = tmp_path / "data"
    entry = _cifar_folder(root)
    with open(entry, "r+b") as fh:
        fh.truncate(bound + 1)  # sparse: no disk space used
    proc = _load_in_child(f"load_cifar10({str(root)!r}, download=False)", root, tmp_path / "cache")
    _one_line_naming(proc, entry, "bound")


# -- outputs: nothing is written through a link planted in an output folder ----------------------------


def _fedhv(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedhv.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.needs_data
def test_table_out_refuses_a_planted_link_and_leaves_its_target(small_grid: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / "table11.md").symlink_to(victim)
    proc = _fedhv("table", str(small_grid), "--table", "11", "--out", str(out))
    assert victim.read_text() == "precious\n"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{out / 'table11.md'} is a symbolic link" in proc.stderr, proc.stderr
    assert (out / "table11.md").is_symlink()  # refused, not replaced: the user decides


@pytest.mark.needs_data
def test_plot_refuses_a_planted_link_and_leaves_its_target(small_grid: Path, tmp_path: Path) -> None:
    first = _fedhv("plot", str(small_grid), "--out", str(tmp_path / "fresh"), "--formats", "png")
    assert first.returncode == 0, first.stderr[-2000:]
    name = Path(first.stdout.split()[0]).name
    out = tmp_path / "figures"
    out.mkdir()
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"precious")
    (out / name).symlink_to(victim)
    proc = _fedhv("plot", str(small_grid), "--out", str(out), "--formats", "png")
    assert victim.read_bytes() == b"precious"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{out / name} is a symbolic link" in proc.stderr, proc.stderr


@pytest.mark.needs_data
def test_flower_export_never_writes_through_a_planted_temporary_name(tmp_path: Path) -> None:
    """The old export wrote ``client-K.npz.tmp.npz`` and renamed it: a link planted under that name
    was written through. Now the temporary file is exclusive and unpredictable."""
    out = tmp_path / "nodes"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for k in (0, 1):
        (out / f"client-{k}.npz.tmp.npz").symlink_to(victim)
    sets = [a for o in SMALL for a in ("--set", o)]
    proc = _fedhv("flower", "export", "multimnist", "--out", str(out), "--clients", "0,1", *sets)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert victim.read_text() == "precious\n"
    for k in (0, 1):
        with np.load(out / f"client-{k}.npz") as z:
            assert z["x"].dtype == np.uint8 and len(z["x"]) == len(z["y"]) > 0
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left behind


@pytest.mark.needs_data
def test_export_refuses_an_output_that_is_a_link(tmp_path: Path) -> None:
    out = tmp_path / "nodes"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / "client-0.npz").symlink_to(victim)
    sets = [a for o in SMALL for a in ("--set", o)]
    proc = _fedhv("flower", "export", "multimnist", "--out", str(out), "--clients", "0", *sets)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{out / 'client-0.npz'} is a symbolic link" in proc.stderr, proc.stderr
    assert victim.read_text() == "precious\n"


# -- a resume never writes into a file shared with another name -----------------------------------------


@pytest.mark.needs_data
def test_resume_replaces_a_hard_linked_run_file_by_a_private_copy(tmp_path: Path) -> None:
    sets = [a for o in SMALL for a in ("--set", o)]
    run = tmp_path / "run"
    done = _fedhv("run", "multimnist", "--method", "uniform", "--rounds", "2", "--out", str(run), "--quiet", *sets)
    assert done.returncode == 0, done.stderr[-2000:]
    for gone in ("summary.json", "model.pt"):  # unfinished: the resume rewrites the logs
        (run / gone).unlink()
    backups = {}
    for name in ("metrics.jsonl", "rounds.jsonl"):
        backups[name] = tmp_path / f"backup-{name}"
        os.link(run / name, backups[name])  # e.g. `cp -al run backup`
    before = {name: path.read_bytes() for name, path in backups.items()}
    proc = _fedhv("run", "--resume", str(run), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name, path in backups.items():
        assert path.read_bytes() == before[name], f"the resume wrote into {path} through a hard link"
        assert os.stat(run / name).st_nlink == 1 and (run / name).stat().st_ino != path.stat().st_ino
        assert f"{run / name} had 2 hard links" in proc.stderr, proc.stderr
    assert (run / "summary.json").is_file()


@pytest.mark.needs_data
@pytest.mark.parametrize("name", ["summary.json", "config.toml"])
def test_resume_of_a_run_whose_file_is_a_fifo_is_refused_at_once(tmp_path: Path, name: str) -> None:
    """A received run directory whose ``summary.json`` / ``config.toml`` is a FIFO: the resume
    names the file in one line instead of waiting on the pipe for ever."""
    sets = [a for o in SMALL for a in ("--set", o)]
    run = tmp_path / "run"
    done = _fedhv("run", "multimnist", "--method", "uniform", "--rounds", "2", "--out", str(run), "--quiet", *sets)
    assert done.returncode == 0, done.stderr[-2000:]
    for gone in ("summary.json", "model.pt", name):
        (run / gone).unlink(missing_ok=True)
    os.mkfifo(run / name)
    try:
        proc = subprocess.run([sys.executable, "-m", "fedhv.cli", "run", "--resume", str(run), "--quiet"],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the resume waited on the FIFO {run / name}")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], proc.stderr[-2000:]


def test_safe_io_refuses_fifos_devices_and_links_by_name(tmp_path: Path) -> None:
    """The helper itself: each refusal is one line naming the file; none blocks."""
    from fedhv import safe_io

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    (tmp_path / "target").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    deep = tmp_path / "sub" / "link"
    deep.symlink_to(tmp_path / "target")
    cases = [
        (lambda: safe_io.read_regular(fifo), f"{fifo} is a FIFO"),
        (lambda: safe_io.read_regular("/dev/null"), "/dev/null is a character device"),
        (lambda: safe_io.read_regular(link), f"{link} is a symbolic link"),
        (lambda: safe_io.read_regular(deep, follow=True, root=tmp_path / "sub"), "out of the data root"),
        (lambda: safe_io.read_regular(tmp_path / "target", max_bytes=9), "larger than fedhv's bound"),
        (lambda: safe_io.write_atomic_bytes(link, b"y"), f"{link} is a symbolic link"),
        (lambda: safe_io.write_atomic_bytes(fifo, b"y"), f"{fifo} is a FIFO"),
    ]
    for call, words in cases:
        with pytest.raises(safe_io.UnsafeFileError) as info:
            call()
        assert words in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert safe_io.read_regular(link, follow=True, root=tmp_path) == b"x" * 10
    assert (tmp_path / "target").read_bytes() == b"x" * 10
