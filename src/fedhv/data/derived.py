"""Derived arrays keyed by their sources, with the provenance of what was used.

:func:`load_derived` first verifies the source files present under the data root
(:func:`resolve_sources`; digests memoised by size and mtime, so a warm run only
``stat``s them), then looks the derived arrays up under a key made of the construction
parameters *and* the fingerprint of every source. Next to each cache file a record
``<name>-<construction>.sources.json`` keeps the last sources it was built from; it is
consulted only when sources are missing, so that a cache built elsewhere stands in for
them -- announced in one line (``data: sources missing under ROOT; using the cached
derived arrays built from ... on DATE``) and recorded in the provenance.
"""

from __future__ import annotations

import datetime
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedhv.data.cache import cache_key, fetch_arrays, load_arrays, read_json, save_arrays, write_json
from fedhv.data.files import cache_root, data_root
from fedhv.data.provenance import DigestMemo, SourceRecord

log = logging.getLogger("fedhv")


def _mnist(base: Path, memo: DigestMemo) -> SourceRecord | None:
    from fedhv.data.idx import MNIST, idx_source

    return idx_source(MNIST, base, memo)


def _fashion(base: Path, memo: DigestMemo) -> SourceRecord | None:
    from fedhv.data.idx import FASHION_MNIST, idx_source

    return idx_source(FASHION_MNIST, base, memo)


def _cifar(base: Path, memo: DigestMemo) -> SourceRecord | None:
    from fedhv.data.cifar import cifar_source

    return cifar_source(base, memo)


def _celeba(base: Path, memo: DigestMemo) -> SourceRecord | None:
    from fedhv.data.celeba import celeba_source

    return celeba_source(base, memo)


#: Data set name -> resolver ``(data root, memo) -> SourceRecord | None``.
RESOLVERS: dict[str, Callable[[Path, DigestMemo], SourceRecord | None]] = {
    "MNIST": _mnist, "Fashion-MNIST": _fashion, "CIFAR-10": _cifar, "CelebA": _celeba,
}


def resolve_sources(datasets: tuple[str, ...], base: Path) -> dict[str, SourceRecord | None]:
    """Verified records of ``datasets`` under ``base`` (``None`` for a data set with missing files).

    Raises
    ------
    DataError
        When a present source file is corrupted (checksum mismatch) or unreadable.
    """
    memo = DigestMemo()
    try:
        return {d: RESOLVERS[d](base, memo) for d in datasets}
    finally:
        memo.save()


def load_derived(
    name: str, datasets: tuple[str, ...], params: dict[str, Any], root: str | Path | None,
    build: Callable[[], dict[str, np.ndarray]], use_cache: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Derived arrays of ``name`` and the provenance of the data they come from.

    Parameters
    ----------
    datasets : tuple of str
        The source data sets (keys of :data:`RESOLVERS`).
    params : dict
        The construction parameters (benchmark, pairing seed, version).
    build : callable
        Builds the arrays from the sources (raises the missing-file error, or downloads).

    Returns
    -------
    arrays : dict
    provenance : dict
        ``root``, ``sources`` (one record per data set: files with sizes and digests,
        fingerprint, warnings), ``warnings``, ``cache`` (``file``, ``status``) and, when the
        cache stood in for missing sources, ``sources_missing`` and ``built_from``.
    """
    base = data_root(root)
    records = resolve_sources(datasets, base)
    for rec in records.values():
        for text in rec.warnings if rec is not None else ():
            warnings.warn(text, stacklevel=3)
    record_path = cache_root() / f"{name}-{cache_key(**params)}.sources.json"
    if all(r is not None for r in records.values()):
        arrays, info = fetch_arrays(name, _key(params, records), build, use_cache)
        _remember(record_path, datasets, records, info)
        return arrays, _provenance(base, records, info)
    missing = [d for d, r in records.items() if r is None]
    last = read_json(record_path) if use_cache else None
    if last is not None and _agrees(last, datasets, records):
        file = str(last.get("file", ""))
        path = cache_root() / file
        # only a cache entry of this dataset, by plain name: a record naming another path is not followed
        plain = bool(file) and Path(file).name == file and file.startswith(f"{name}-") and file.endswith(".npz")
        cached = load_arrays(path) if plain else None
        if cached is not None:
            built = datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
            origin = f"{last.get('root')} ({', '.join(f'{d} {fp}' for d, fp in last['fingerprints'].items())})"
            line = f"data: sources missing under {base}; using the cached derived arrays built from {origin} on {built}"
            log.warning(line)
            prov = _provenance(base, records, {"file": str(path), "status": "loaded; sources missing"})
            prov.update(sources_missing=missing, built_from=last)
            prov["warnings"] = [*last.get("warnings", []), line]
            return cached, prov
    arrays = build()  # raises the missing-file error, or downloads the sources
    records = resolve_sources(datasets, base)
    info = {"file": None, "status": "disabled"}
    if use_cache and all(r is not None for r in records.values()):
        path = cache_root() / f"{name}-{_key(params, records)}.npz"
        info = {"file": str(path), "status": "built" if save_arrays(path, arrays) is None else "built, not saved"}
        _remember(record_path, datasets, records, info)
    return arrays, _provenance(base, records, info)


def _key(params: dict[str, Any], records: dict[str, SourceRecord | None]) -> str:
    return cache_key(**params, sources={d: r.fingerprint for d, r in records.items() if r is not None})


def _agrees(last: dict[str, Any], datasets: tuple[str, ...], records: dict[str, SourceRecord | None]) -> bool:
    """The record is for the same data sets, and every data set present now has the recorded fingerprint."""
    fps = last.get("fingerprints")
    if not isinstance(fps, dict) or sorted(fps) != sorted(datasets):
        return False
    return all(r is None or fps.get(d) == r.fingerprint for d, r in records.items())


def _remember(path: Path, datasets: tuple[str, ...], records: dict[str, SourceRecord | None],
              info: dict[str, Any]) -> None:
    """Store the sources behind the cache file in ``info`` (when it was saved and differs from the record)."""
    if info["status"] not in ("built", "loaded") or not info["file"]:
        return
    file = Path(info["file"]).name
    last = read_json(path)
    if last is not None and last.get("file") == file and info["status"] == "loaded":
        return
    present = [r for r in records.values() if r is not None]
    write_json(path, {
        "file": file,
        "root": present[0].root if present else None,
        "fingerprints": {d: r.fingerprint for d, r in records.items() if r is not None},
        "sources": [r.as_dict() for r in present],
        "warnings": [w for r in present for w in r.warnings],
    })


def _provenance(base: Path, records: dict[str, SourceRecord | None], info: dict[str, Any]) -> dict[str, Any]:
    present = [r for r in records.values() if r is not None]
    return {
        "root": str(base.resolve()),
        "sources": [r.as_dict() for r in present],
        "warnings": [w for r in present for w in r.warnings],
        "cache": dict(info),
    }
