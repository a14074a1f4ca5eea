"""Explicit, counter-based random streams.

fedhv never seeds global random state. Every random draw comes from a generator
derived from the run seed and a tuple of keys (purpose, round, client, ...), so
that the same draw is reproduced whatever the order in which it is requested.
This is what lets the batched and the sequential engines agree exactly.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def _key_to_int(key: int | str) -> int:
    if isinstance(key, (int, np.integer)):
        return int(key) & 0xFFFFFFFF
    digest = hashlib.blake2s(str(key).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def derive_seed(seed: int, *keys: int | str) -> int:
    """Derive a 63-bit seed from a base seed and a key path.

    Parameters
    ----------
    seed : int
        The run seed.
    *keys : int or str
        Purpose tags and counters, e.g. ``("batches", round, client)``.

    Returns
    -------
    int
        A seed in ``[0, 2**63)``; distinct key paths give independent streams
        (numpy ``SeedSequence`` hashing).
    """
    entropy = [_key_to_int(seed)] + [_key_to_int(k) for k in keys]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A numpy ``Generator`` for the stream ``(seed, *keys)``."""
    return np.random.default_rng(derive_seed(seed, *keys))


def torch_generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` for the stream ``(seed, *keys)``."""
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, *keys))
    return g
