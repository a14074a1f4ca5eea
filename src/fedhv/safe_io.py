"""The one home of fedhv's file primitives for files it did not make or must not lose.

Every reader of a source data file, a node's data file or a received run file, and every
writer of an output file (run files, tables, plots, exported node files, certificates) goes
through these functions (docs/security.md, "Files"):

- :func:`open_regular` / :func:`read_regular`: open a *regular* file only. The open uses
  ``O_NONBLOCK`` (a FIFO neither blocks the open nor the read) and ``fstat`` then refuses
  anything that is not a regular file (FIFO, device, socket, directory) with one line naming
  the file. With ``follow=False`` a symbolic link is refused (``O_NOFOLLOW``); with ``root``
  a link is followed only when it resolves inside ``root`` (or the link's own folder).
  :func:`read_regular` reads at most ``max_bytes`` and refuses a larger file by name, so
  no file (a link to ``/dev/zero``, a sparse 1 TB file) can exhaust memory;
  :func:`gunzip_regular` bounds the *decompressed* size the same way.
- :func:`write_atomic` (fedhv's one atomic write; :func:`write_atomic_with` and
  :func:`write_atomic_bytes` are its older names): the content goes to a temporary file
  created exclusively (``O_EXCL``) under an unpredictable name in the destination's folder
  (:func:`tempfile.mkstemp`), gets its mode, is fsync'ed and renamed over the destination
  (and the folder fsync'ed with ``fsync_dir``), so a planted link or file in the output
  folder is never written through. A destination that is a symbolic link, a FIFO or a
  device is refused unless ``replace_link`` says to replace the link itself.
  :func:`write_json` (fedhv's one JSON writer) writes strict JSON through it.
- :func:`unshare` replaces a file with more than one hard link by a private copy (same
  content, same mode) before fedhv appends to or truncates it, so writing a run never
  writes into another name of the same inode (a backup made with ``cp -al``, or a link a
  received run directory planted).

Bottom layer: imports nothing from fedhv but :mod:`fedhv.errors`.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import io
import json
import math
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from fedhv import procfs
from fedhv.errors import FedHVError

MiB = 1 << 20
#: Default bound of :func:`read_regular` (a source archive, an annotation list, a run file).
MAX_FILE_BYTES = 1 << 30
_CHUNK = 1 << 20


class UnsafeFileError(FedHVError, OSError):
    """A file fedhv refuses to read or write: not a regular file, a link it must not follow,
    a link out of the data root, a file over its size bound, or a destination that is a link.

    An ``OSError`` (``except OSError`` still catches it) whose ``str()`` is one line naming the
    file, what it is and the fix; ``filename`` is the file.
    """

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.filename = None if path is None else str(path)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def kind_of(mode: int) -> str:
    """``a FIFO (named pipe)``, ``a character device``, ... for an ``st_mode`` that is not a regular file."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` (resolved) lies in ``folder`` (resolved)."""
    try:
        Path(path).resolve().relative_to(Path(folder).resolve())
    except (ValueError, OSError, RuntimeError):
        return False
    return True


def check_link(path: Path, root: Path | None) -> Path:
    """The path to open for ``path``: itself, or the resolved target of a link that stays inside.

    A symbolic link at ``path`` is followed only when ``root`` is given and its target
    resolves inside ``root`` or inside the folder holding the link; otherwise it is refused
    with one line naming the link and its target. (Folders above ``path`` are the operator's
    layout and are not checked.)
    """
    path = Path(path)
    if not path.is_symlink():
        return path
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise UnsafeFileError(f"{path} is a broken or looping symbolic link ({exc}); replace it by the file", path) \
            from None
    if root is not None and (inside(target, root) or inside(target, path.parent)):
        return target
    where = f"out of the data root {root}" if root is not None else "where fedhv does not follow links"
    raise UnsafeFileError(f"{path} is a symbolic link to {target}, {where}; copy the file there instead of "
                          "linking it", path)


def open_regular(path: str | os.PathLike[str], *, follow: bool = False, root: Path | None = None) -> BinaryIO:
    """``path`` opened for binary reading, checked to be a regular file.

    Parameters
    ----------
    path : path-like
        The file.
    follow : bool
        Follow a symbolic link at ``path`` (``False``: refuse it, ``O_NOFOLLOW``).
    root : Path, optional
        With ``follow``, follow a link only when it resolves inside ``root`` (or the
        link's own folder); see :func:`check_link`.

    Raises
    ------
    UnsafeFileError
        ``path`` is a link not to follow, a FIFO, a device, a socket or a directory.
    OSError
        The file is missing or unreadable (``FileNotFoundError``, ``PermissionError``, ...).
    """
    path = Path(path)
    target = check_link(path, root) if follow and root is not None else path
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow and root is None else os.O_NOFOLLOW)
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(f"{path} is a symbolic link; fedhv does not follow links here: replace it by the "
                                  "file itself", path) from None
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing without a reader)
            raise UnsafeFileError(f"{path} is not a regular file; replace it by the file itself", path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(f"{path} is {kind_of(st.st_mode)}, not a regular file; fedhv reads only regular "
                                  "files: replace it by the file itself", path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def too_large(path: Path, max_bytes: int, what: str = "") -> UnsafeFileError:
    """The error for a file (or its decompressed content) larger than ``max_bytes``."""
    return UnsafeFileError(f"{path}{what} is larger than fedhv's bound of {max_bytes:,} bytes for it; this is not "
                           "the expected file: replace it", path)


def read_regular(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES, *, follow: bool = False,
                 root: Path | None = None) -> bytes:
    """At most ``max_bytes`` of the regular file ``path`` (see :func:`open_regular`).

    Raises
    ------
    UnsafeFileError
        Not a regular file, a refused link, or larger than ``max_bytes`` (checked on its
        size and again while reading, so a file growing meanwhile is refused too).
    """
    path = Path(path)
    with open_regular(path, follow=follow, root=root) as fh:
        if os.fstat(fh.fileno()).st_size > max_bytes:
            raise too_large(path, max_bytes)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise too_large(path, max_bytes)
    return data


def gunzip_regular(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES, *, follow: bool = False,
                   root: Path | None = None, max_compressed: int = MAX_FILE_BYTES) -> bytes:
    """The decompressed content of the gzip file ``path``, at most ``max_bytes`` of it.

    Raises
    ------
    UnsafeFileError
        As :func:`read_regular`, or a decompressed size over ``max_bytes`` (a gzip bomb).
    OSError, EOFError, zlib.error
        A damaged gzip stream.
    """
    path = Path(path)
    blob = read_regular(path, max_compressed, follow=follow, root=root)
    out = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(blob), mode="rb") as gz:
        while chunk := gz.read(_CHUNK):
            out += chunk
            if len(out) > max_bytes:
                raise too_large(path, max_bytes, " decompressed")
    return bytes(out)


# --------------------------------------------------------------------------- strict JSON


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf), at any depth, replaced by ``None``.

    Tuples become lists; other values are returned unchanged.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def dumps_strict(data: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite_json` ``(data)`` with ``allow_nan=False``: strict JSON (RFC 8259), never
    the bare ``NaN`` / ``Infinity`` tokens other readers reject; a non-finite number is written ``null``."""
    return json.dumps(finite_json(data), allow_nan=False, **kwargs)


# --------------------------------------------------------------------------- writing


def _umask() -> int:
    """The process's umask: ``/proc/self/status`` (read without changing it), else set and restored."""
    value = procfs.self_status("Umask")
    try:
        return int(value, 8) if value is not None else _set_and_restore_umask()
    except ValueError:
        return _set_and_restore_umask()


def _set_and_restore_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """Mode of a newly created file, ``0o666 & ~umask`` (what ``open()`` gives)."""
    return 0o666 & ~_umask()


def check_destination(path: Path, replace_link: bool = False) -> None:
    """Refuse an output path that is a symbolic link (unless ``replace_link``), a FIFO, a device,
    a socket or a directory (one line naming it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError:
        return  # the write itself reports it
    if stat.S_ISREG(st.st_mode) or (stat.S_ISLNK(st.st_mode) and replace_link):
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFileError(f"{path} is a symbolic link (to {os.readlink(path)}); fedhv never writes through a "
                              "link: remove it or choose another output", path)
    raise UnsafeFileError(f"{path} is {kind_of(st.st_mode)}, not a regular file; fedhv writes only regular files: "
                          "remove it or choose another output", path)


#: What :func:`write_atomic` writes: bytes, text (UTF-8), or a function writing to the open file.
Content = bytes | str | Callable[[BinaryIO], object]


def write_atomic(path: str | os.PathLike[str], content: Content, *, mode: int | None = None,
                 replace_link: bool = False, fsync_dir: bool = False) -> None:
    """Write ``content`` to a new temporary file next to ``path``, fsync it and rename it to ``path``.

    fedhv's one atomic write. The temporary file is made with ``O_EXCL`` under an
    unpredictable name (:func:`tempfile.mkstemp`) in ``path``'s folder, so nothing planted
    there is written through; a kill leaves the old file or the complete new one.

    Parameters
    ----------
    path : path-like
        The destination; its folder must exist.
    content : bytes, str or callable
        The bytes, a text (written as UTF-8), or a function called with the open binary
        file that writes the content itself (e.g. ``np.savez``).
    mode : int, optional
        The new file's mode; default ``0o666 & ~umask`` (``mkstemp`` alone gives ``0o600``).
        Pass ``0o600`` for a secret, which is then never readable by others, not even for
        a moment.
    replace_link : bool
        Replace a symbolic link at ``path`` by the file (never write through it) instead
        of refusing it.
    fsync_dir : bool
        Also fsync the folder after the rename, so the rename itself survives a power cut.

    Raises
    ------
    UnsafeFileError
        ``path`` is a symbolic link (unless ``replace_link``), a FIFO, a device or a
        directory.
    OSError
        The folder cannot be written (the temporary file is removed).
    """
    path = Path(path)
    check_destination(path, replace_link)
    if isinstance(content, str):
        content = content.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), new_file_mode() if mode is None else mode)
            if callable(content):
                content(fh)
            else:
                fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        if fsync_dir:
            _fsync_dir(path.parent)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_atomic_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], object], *, mode: int | None = None,
                      replace_link: bool = False, fsync_dir: bool = False) -> None:
    """:func:`write_atomic` with a function writing the content (its older name)."""
    write_atomic(path, write, mode=mode, replace_link=replace_link, fsync_dir=fsync_dir)


def write_atomic_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """:func:`write_atomic` of ``data`` (its older name)."""
    write_atomic(path, data, mode=mode)


def json_text(data: Any, **kwargs: Any) -> str:
    """The text :func:`write_json` writes: :func:`dumps_strict` with ``indent=2`` and a final newline.

    ``kwargs`` go to ``json.dumps`` (e.g. ``default=str``).
    """
    return dumps_strict(data, indent=2, **kwargs) + "\n"


def write_json(path: str | os.PathLike[str], data: Any, *, default: Callable[[Any], Any] | None = None,
               mode: int | None = None, replace_link: bool = False, fsync_dir: bool = False) -> None:
    """Write ``data`` to ``path`` as strict, pretty-printed JSON through :func:`write_atomic`.

    fedhv's one JSON writer: a non-finite float (NaN, ±inf), at any depth, is written
    ``null`` (:func:`dumps_strict`), keys keep their order, two spaces of indent, one final
    newline.

    Parameters
    ----------
    path : path-like
        The destination.
    data : Any
        A JSON-able value.
    default : callable, optional
        ``json.dumps``'s ``default`` (how to write a value JSON has no form for).
    mode, replace_link, fsync_dir
        As :func:`write_atomic`.

    Raises
    ------
    UnsafeFileError, OSError
        As :func:`write_atomic`.
    """
    write_atomic(path, json_text(data, default=default), mode=mode, replace_link=replace_link, fsync_dir=fsync_dir)


def _fsync_dir(folder: Path) -> None:
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def unshare(path: str | os.PathLike[str]) -> bool:
    """Replace the regular file ``path`` by a private copy when it has more than one hard link.

    Returns whether it did (with one warning naming the file). The copy has the same
    content and mode; the other names keep the old inode untouched, so appending to or
    truncating ``path`` afterwards changes only ``path``. A link or a missing file is
    left alone (the callers refuse links themselves).
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_nlink <= 1:
        return False
    with open_regular(path) as src:
        write_atomic_with(path, lambda fh: shutil.copyfileobj(src, fh, _CHUNK), mode=stat.S_IMODE(st.st_mode))
    warnings.warn(f"{path} had {st.st_nlink} hard links; fedhv replaced it by a private copy before writing it, so "
                  "the other names keep their content", stacklevel=2)
    return True


def refuse_shared(fd: int, path: Path) -> None:
    """Refuse an open file with more than one hard link (raised after :func:`unshare` lost a race)."""
    if os.fstat(fd).st_nlink > 1:
        raise UnsafeFileError(f"{path} has {os.fstat(fd).st_nlink} hard links; fedhv does not write into a file "
                              "shared with another name: copy it (cp, not ln) and try again", path)
