"""The partition loop as first written (lists rebuilt on every take and top-up, O(N n)): the
oracle for the faster :func:`fedhv.data.partition.dirichlet_partition`, which must give the
same partition for the same seed (every result of the paper's settings depends on it)."""

from __future__ import annotations

import numpy as np

from fedhv.rng import numpy_rng


def reference_partition(strata: np.ndarray, clients: int, samples_per_client: int, alpha: float,
                        seed: int) -> np.ndarray:
    rng = numpy_rng(seed, "dirichlet-partition")
    order = np.argsort(strata, kind="stable")
    keys, starts = np.unique(strata[order], return_index=True)
    pools = [list(rng.permutation(idx)) for idx in np.split(order, starts[1:])]
    used: list[list[int]] = [[] for _ in pools]
    out = np.empty((clients, samples_per_client), dtype=np.int64)
    for c in range(clients):
        p = rng.dirichlet(np.full(len(keys), alpha))
        mine: list[int] = []
        wants = np.floor(p * samples_per_client).astype(np.int64)
        for k in np.flatnonzero(wants).tolist():
            want = int(wants[k])
            if len(pools[k]) < want:
                refill = pools[k] + used[k]
                pools[k] = list(rng.permutation(refill)) if refill else []
                used[k] = []
            take = pools[k][:want]
            pools[k] = pools[k][want:]
            used[k].extend(take)
            mine.extend(take)
        short = samples_per_client - len(mine)
        if short > 0:
            leftovers = [(k, i) for k in range(len(keys)) for i in pools[k]]
            if len(leftovers) < short:
                mine_set = set(mine)
                for k in range(len(keys)):
                    everything = pools[k] + used[k]
                    used[k] = [i for i in everything if i in mine_set]
                    pools[k] = [i for i in rng.permutation(everything) if i not in mine_set]
                leftovers = [(k, i) for k in range(len(keys)) for i in pools[k]]
            chosen = [leftovers[j] for j in rng.permutation(len(leftovers))[::-1][:short]]
            taken: dict[int, set[int]] = {}
            for k, i in chosen:
                taken.setdefault(k, set()).add(i)
                used[k].append(i)
                mine.append(i)
            for k, ids in taken.items():
                pools[k] = [i for i in pools[k] if i not in ids]
        out[c] = np.asarray(mine, dtype=np.int64)
    return out
