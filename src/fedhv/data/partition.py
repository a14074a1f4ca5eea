"""Dirichlet client partitioning (reference notes §3; Hsu et al., 2019).

Every client receives exactly ``samples_per_client`` distinct training indices.
For each client ``c = 0..N-1`` in order:

1. draw ``p ~ Dirichlet(alpha * 1_K)`` over the ``K`` present strata (sorted);
2. for each stratum ``k``, take ``n_k = floor(p_k * S)`` indices from the front of
   that stratum's shuffled pool; when the pool is shorter than ``n_k`` it is refilled
   with everything handed out from that stratum so far (recycling), reshuffled;
3. top up to ``S`` with indices drawn uniformly from all remaining pool entries.

This follows the reference code step for step, with a ``numpy.random.Generator``
seeded by the partition seed instead of global numpy state. Where the reference
would fail (the remaining pools cannot top a client up), the pools are recycled and
a warning is issued.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedhv.errors import ConfigError
from fedhv.rng import numpy_rng


def dirichlet_partition(
    strata: np.ndarray, clients: int, samples_per_client: int | np.ndarray, alpha: float, seed: int
) -> np.ndarray | list[np.ndarray]:
    """Partition training indices among clients.

    Parameters
    ----------
    strata : ndarray, int ``[n]``
        Stratum label of every training sample.
    clients : int
        Number of clients ``N``.
    samples_per_client : int or ndarray ``[N]``
        Exact local dataset size ``S`` of every client, or one size per client
        (:func:`client_sizes`; step 2 then uses client ``c``'s own ``S_c``).
    alpha : float
        Dirichlet concentration (smaller = more concentrated label mixtures).
    seed : int
        Partition seed (paper: 10, fixed across methods).

    Returns
    -------
    ndarray, int64 ``[N, S]`` or list of ndarray
        Row ``c`` holds client ``c``'s training indices (distinct within a row); a list of
        ``N`` arrays of the given sizes when ``samples_per_client`` is an array.
    """
    if alpha <= 0:
        raise ConfigError(f"partition.alpha = {alpha} must be > 0")
    n = len(strata)
    ragged = not isinstance(samples_per_client, (int, np.integer))
    target = (np.asarray(samples_per_client, dtype=np.int64) if ragged
              else np.full(clients, int(samples_per_client), dtype=np.int64))
    if len(target) != clients:
        raise ValueError(f"{len(target)} client sizes for {clients} clients")
    if int(target.max(initial=0)) > n:
        raise ConfigError(
            f"partition.samples_per_client = {int(target.max())} exceeds the {n} training samples; "
            "lower it"
        )
    if clients > n and not ragged:  # unequal sizes (cross-device): clients share samples, as recycling does
        raise ConfigError(
            f"partition.clients = {clients} exceeds the {n} training samples; every client needs its own "
            "samples, so lower partition.clients"
        )
    rng = numpy_rng(seed, "dirichlet-partition")
    # Indices of each stratum in ascending order (== np.flatnonzero(strata == k) for every sorted
    # key k), by one stable sort: O(n log n) instead of O(K n) for K strata (CelebA5's joint code
    # of 40 attributes has tens of thousands).
    order = np.argsort(strata, kind="stable")
    keys, starts = np.unique(strata[order], return_index=True)
    # pools[k][heads[k]:] is stratum k's pool (a head offset instead of re-slicing the list on
    # every take); the top-up picks its entries by position in the concatenation of the pools
    # (strata in order) without building that list: O(K + picks) per client instead of O(n).
    # The random draws and their order are exactly the reference's (tests/unit/data/test_partition.py
    # checks the result against the list-building loop).
    pools: list[list[int]] = []
    heads: list[int] = []
    used: list[list[int]] = []
    for idx in np.split(order, starts[1:]):
        pools.append(list(rng.permutation(idx)))
        heads.append(0)
        used.append([])

    def pool(k: int) -> list[int]:
        return pools[k][heads[k]:] if heads[k] else pools[k]

    rows_out: list[np.ndarray] = []
    recycled = 0
    exhausted: dict[int, int] = {}  # stratum -> times its pool ran dry
    for c in range(clients):
        size = int(target[c])
        p = rng.dirichlet(np.full(len(keys), alpha))
        mine: list[int] = []
        wants = np.floor(p * size).astype(np.int64)
        for k in np.flatnonzero(wants).tolist():  # strata in sorted order; n_k = 0 takes nothing
            want = int(wants[k])
            if len(pools[k]) - heads[k] < want:
                refill = pool(k) + used[k]
                pools[k], heads[k] = (list(rng.permutation(refill)) if refill else []), 0
                used[k] = []
                recycled += 1
                exhausted[k] = exhausted.get(k, 0) + 1
            take = pools[k][heads[k]:heads[k] + want]
            heads[k] += len(take)
            used[k].extend(take)
            mine.extend(take)
        short = size - len(mine)
        if short > 0:
            sizes = np.array([len(pools[k]) - heads[k] for k in range(len(keys))], dtype=np.int64)
            if int(sizes.sum()) < short:
                # Reshuffle every stratum; the client's own samples stay out of the pools (no
                # duplicates within a row) but remain in circulation as ``used`` for later clients.
                mine_set = set(mine)
                for k in range(len(keys)):
                    everything = pool(k) + used[k]
                    used[k] = [i for i in everything if i in mine_set]
                    pools[k], heads[k] = [i for i in rng.permutation(everything) if i not in mine_set], 0
                recycled += 1
                sizes = np.array([len(pools[k]) for k in range(len(keys))], dtype=np.int64)
            ends = np.cumsum(sizes)
            picks = rng.permutation(int(ends[-1]))[::-1][:short]  # positions in the concatenated pools
            strata_of = np.searchsorted(ends, picks, side="right")
            taken: dict[int, set[int]] = {}
            for j, k in zip(picks.tolist(), strata_of.tolist()):
                i = pools[k][heads[k] + j - int(ends[k] - sizes[k])]
                taken.setdefault(k, set()).add(i)
                used[k].append(i)
                mine.append(i)
            for k, ids in taken.items():
                pools[k], heads[k] = [i for i in pool(k) if i not in ids], 0
        rows_out.append(np.asarray(mine, dtype=np.int64))
    if ragged:
        if recycled:
            warnings.warn(_recycling_note(keys, exhausted, recycled, np.concatenate(rows_out), n), stacklevel=2)
        return rows_out
    out = np.stack(rows_out) if rows_out else np.empty((0, int(samples_per_client)), dtype=np.int64)
    if recycled:
        warnings.warn(_recycling_note(keys, exhausted, recycled, out, n), stacklevel=2)
    return out


def client_sizes(clients: int, mean: int, sigma: float, min_samples: int, seed: int, limit: int) -> np.ndarray:
    """Unequal local dataset sizes (``partition.sizes = "lognormal"``).

    ``n_k = clip(round(mean * exp(sigma z_k - sigma^2 / 2)), min_samples, limit)`` with
    ``z_k ~ N(0, 1)`` i.i.d. (stream ``client-sizes`` of the partition seed): log-normal sizes
    whose mean before clipping is ``mean`` and whose spread grows with ``sigma``: a few large
    clients and many small ones, as in cross-device data sets with one client per user (LEAF,
    Caldas et al., 2018). ``limit`` is the number of training samples.
    """
    z = numpy_rng(seed, "client-sizes").standard_normal(clients)
    raw = np.rint(mean * np.exp(sigma * z - sigma * sigma / 2.0))
    return np.clip(raw, min_samples, limit).astype(np.int64)


def _recycling_note(keys: np.ndarray, exhausted: dict[int, int], recycled: int, out: np.ndarray, n: int) -> str:
    """The recycling warning: how often, which strata ran dry, and how many client slots repeat a sample."""
    shared = int(out.size - len(np.unique(out)))
    topups = recycled - sum(exhausted.values())
    dry = ", ".join(f"{int(keys[k])} ({times}x)" for k, times in sorted(exhausted.items())[:5])
    more = "" if len(exhausted) <= 5 else f" and {len(exhausted) - 5} more"
    parts = []
    if exhausted:
        parts.append(f"the Dirichlet draws asked strata for more samples than they hold (ran dry: {dry}{more})")
    if topups:
        parts.append(f"the remaining pools could not top {topups} client(s) up")
    return (f"the partition recycled samples {recycled} time(s): {' and '.join(parts)}, so {shared} of the "
            f"{out.size} client slots repeat a sample another client also holds ({n} samples; as in the reference "
            "code). For clients that share no sample use the disjoint rule (FederatedDataset.from_tensors(partition="
            "\"dirichlet-disjoint\"), fedhv.data.partition.disjoint_dirichlet_partition)")


def disjoint_dirichlet_partition(strata: np.ndarray, clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Label-wise Dirichlet split: every sample goes to exactly one client (Hsu et al., 2019 style).

    For every stratum ``k`` (sorted), draw ``q ~ Dirichlet(alpha * 1_N)`` over the clients and
    cut the stratum's shuffled indices at the cumulative shares ``round(cumsum(q) * n_k)``:
    client ``c`` gets ``n_k q_c`` of them, up to rounding. No sample is shared; client sizes
    vary (small ``alpha``: very unequal, some clients may be empty -- fedhv never samples an
    empty client).

    Returns
    -------
    list of ndarray, int64
        Client ``c``'s training indices (sorted), ``N`` entries.
    """
    if alpha <= 0:
        raise ConfigError(f"alpha = {alpha} must be > 0")
    if clients < 1:
        raise ConfigError(f"clients = {clients} must be >= 1")
    rng = numpy_rng(seed, "dirichlet-disjoint")
    order = np.argsort(strata, kind="stable")
    _, starts = np.unique(strata[order], return_index=True)
    rows: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for idx in np.split(order, starts[1:]):
        shuffled = rng.permutation(idx)
        q = rng.dirichlet(np.full(clients, alpha))
        cuts = np.round(np.cumsum(q)[:-1] * len(idx)).astype(np.int64)
        for c, piece in enumerate(np.split(shuffled, cuts)):
            rows[c].append(piece)
    return [np.sort(np.concatenate(r)).astype(np.int64) for r in rows]


def label_histograms(labels: np.ndarray, parts: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-client class counts ``[N, num_classes]`` of one task's labels."""
    return np.stack([np.bincount(labels[row], minlength=num_classes) for row in parts])


def identity_partition(groups: np.ndarray, clients: int, min_images: int, seed: int) -> list[np.ndarray]:
    """A natural federation: the training samples' identities (a celebrity, a writer) grouped into clients.

    Identities with fewer than ``min_images`` samples are left out (LEAF keeps CelebA's celebrities with at
    least 5 images, Caldas et al., 2018); the others are shuffled (stream ``identity-groups`` of the
    partition ``seed``) and dealt into ``clients`` groups of as equal a count of identities as possible
    (``numpy.array_split``). Client ``c`` holds every sample of its identities, in index order: no sample is
    shared and no identity is split.

    Raises
    ------
    ConfigError
        When fewer identities qualify than there are clients (naming both counts and the fix).
    """
    ids = np.asarray(groups)
    keys, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    kept = np.flatnonzero(counts >= min_images)
    if len(kept) < clients:
        raise ConfigError(f"partition.clients = {clients} but only {len(kept)} of {len(keys)} identities have at "
                          f"least partition.min_identity_images = {min_images} training samples; lower one of them")
    order = numpy_rng(seed, "identity-groups").permutation(kept)
    owner = np.full(len(keys), -1, dtype=np.int64)
    for c, members in enumerate(np.array_split(order, clients)):
        owner[members] = c
    client_of = owner[inverse]
    return [np.flatnonzero(client_of == c).astype(np.int64) for c in range(clients)]

