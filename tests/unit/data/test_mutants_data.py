"""Tests that kill surviving mutants of ``data/partition.py`` and ``sim/plan.py`` (issue 11).

Oracles: draws made directly from the documented stream keys (design.md: every random
choice is keyed by ``(seed, stream, purpose, round, client, tag, copy)``), hand-derived
partitions of one stratum, and the exact warning text.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fedhv.data.augment import Augment
from fedhv.data.partition import dirichlet_partition
from fedhv.rng import numpy_rng, torch_generator
from fedhv.sim.plan import client_plan, report_indices, stack_plans

# --------------------------------------------------------------------------- partition


def test_as_many_clients_as_samples_is_allowed() -> None:
    """clients == n, one sample each: every sample goes to exactly one client."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parts = dirichlet_partition(np.zeros(5, dtype=np.int64), 5, 1, 0.3, 0)
    assert sorted(parts.ravel().tolist()) == [0, 1, 2, 3, 4]


def test_one_stratum_partition_is_the_keyed_permutation() -> None:
    """One stratum: p = (1), so client 0 takes the first S of the stratum's permutation
    drawn from ``numpy_rng(seed, "dirichlet-partition")``."""
    strata = np.zeros(30, dtype=np.int64)
    parts = dirichlet_partition(strata, 1, 12, 0.5, 10)
    want = numpy_rng(10, "dirichlet-partition").permutation(30)[:12]
    np.testing.assert_array_equal(parts[0], want)


def test_recycling_once_is_counted_once() -> None:
    """One stratum of 4, 2 clients x 3: client 1 finds 1 < 3 left and recycles once."""
    with pytest.warns(UserWarning) as rec:
        parts = dirichlet_partition(np.zeros(4, dtype=np.int64), 2, 3, 1.0, 0)
    assert [str(w.message) for w in rec] == [(
        "the partition recycled samples 1 time(s): the Dirichlet draws asked strata for more samples than they hold "
        "(ran dry: 0 (1x)), so 2 of the 6 client slots repeat a sample another client also holds (4 samples; as in "
        "the reference code). For clients that share no sample use the disjoint rule (FederatedDataset.from_tensors("
        "partition=\"dirichlet-disjoint\"), fedhv.data.partition.disjoint_dirichlet_partition)"
    )]
    assert all(len(set(row)) == 3 for row in parts.tolist())


def test_running_out_of_leftovers_reshuffles_every_stratum() -> None:
    """Tiny strata (4 + 4 samples), 4 samples per client, 5 clients: the floors of
    ``p_k S`` leave clients short and the leftovers run out (the second recycling path,
    reached with seed 1). Every row still holds distinct valid indices."""
    strata = np.repeat([0, 1], 4)
    with pytest.warns(UserWarning, match=r"^the partition recycled samples \d+ time\(s\)"):
        parts = dirichlet_partition(strata, 5, 4, 1.0, 1)
    assert parts.shape == (5, 4)
    for row in parts.tolist():
        assert len(set(row)) == 4 and set(row) <= set(range(8))


# --------------------------------------------------------------------------- plans


def _keys(purpose: str, tag: str = "train") -> torch.Generator:
    return torch_generator(3, "train", purpose, 2, 5, tag, 0)


LOCAL = torch.arange(100, 120)


def test_client_plan_draws_from_the_documented_keys() -> None:
    aug = Augment(rotation_degrees=10.0, integer_angles=True, flip_prob=0.5)
    plan = client_plan(3, "train", 2, 5, LOCAL, 3, 4, aug, {"fc": 3}, 0.25)  # tag defaults to "train"
    perm = torch.randperm(20, generator=_keys("batches"))
    torch.testing.assert_close(plan.batches, LOCAL[perm].view(5, 4)[:3], rtol=0, atol=0)
    angles = torch.randint(-10, 11, (3, 4), generator=_keys("augment")).to(torch.float64)
    assert plan.angles is not None and plan.angles.dtype == torch.float64
    torch.testing.assert_close(plan.angles, angles, rtol=0, atol=0)
    flips = torch.rand(3, generator=_keys("flip")) < 0.5
    assert plan.flips is not None
    torch.testing.assert_close(plan.flips, flips, rtol=0, atol=0)
    masks = torch.rand(3, 4, 3, generator=_keys("dropout")) >= 0.25
    torch.testing.assert_close(plan.masks["fc"], masks, rtol=0, atol=0)


def test_client_plan_float_angles_and_streams() -> None:
    aug = Augment(rotation_degrees=15.0)
    plan = client_plan(3, "train", 2, 5, LOCAL, 3, 4, aug, {}, 0.0, tag="grads")
    want = (torch.rand(3, 4, generator=_keys("augment", "grads"), dtype=torch.float64) * 2 - 1) * 15.0
    assert plan.angles is not None
    torch.testing.assert_close(plan.angles, want, rtol=0, atol=0)
    assert float(plan.angles.abs().max()) <= 15.0 and float(plan.angles.min()) < 0
    other = client_plan(3, "calibration", 2, 5, LOCAL, 3, 4, aug, {}, 0.0, tag="grads")
    assert not torch.equal(plan.batches, other.batches)


def test_no_augmentation_and_zero_flip_probability() -> None:
    plan = client_plan(0, "train", 0, 0, LOCAL, 2, 4, None, {}, 0.0)
    assert plan.angles is None and plan.flips is None
    plan = client_plan(0, "train", 0, 0, LOCAL, 2, 4, Augment(rotation_degrees=0.0, flip_prob=0.0), {}, 0.0)
    assert plan.angles is None and plan.flips is None


def test_flip_probability_one_flips_every_step() -> None:
    """``rand < p``: with p = 1 every step flips, with p = 0.999... almost every; p is a strict bound."""
    plan = client_plan(1, "train", 0, 0, LOCAL, 200, 4, Augment(flip_prob=0.3), {}, 0.0)
    assert plan.flips is not None
    want = torch.rand(200, generator=torch_generator(1, "train", "flip", 0, 0, "train", 0)) < 0.3
    torch.testing.assert_close(plan.flips, want, rtol=0, atol=0)


def test_stack_and_select_keep_the_flips() -> None:
    aug = Augment(flip_prob=0.5)
    plans = [client_plan(2, "train", 0, c, LOCAL, 6, 4, aug, {}, 0.0) for c in range(3)]
    stacked = stack_plans(plans)
    assert stacked.flips is not None
    torch.testing.assert_close(stacked.flips, torch.stack([p.flips for p in plans]), rtol=0, atol=0)  # type: ignore[misc]
    part = stacked.select(slice(1, 3))
    assert part.flips is not None
    torch.testing.assert_close(part.flips, stacked.flips[1:3], rtol=0, atol=0)


def test_report_indices_draw_b_batches_from_the_report_stream() -> None:
    local = torch.arange(10, 20)
    got = report_indices(6, "train", 4, 9, local, 2, 3)
    perm = torch.randperm(10, generator=torch_generator(6, "train", "report", 4, 9))
    torch.testing.assert_close(got, local[perm[:9]].view(3, 3)[:2].reshape(-1), rtol=0, atol=0)
    assert len(set(got.tolist())) == 6
    assert report_indices(6, "train", 4, 9, local, "all", 3) is local


def test_flip_is_strictly_below_the_probability() -> None:
    """``flip = rand < p``: a draw exactly equal to ``p`` does not flip."""
    draws = torch.rand(4, generator=torch_generator(1, "train", "flip", 0, 0, "train", 0))
    p = float(draws[0])
    plan = client_plan(1, "train", 0, 0, LOCAL, 4, 4, Augment(flip_prob=p), {}, 0.0)
    assert plan.flips is not None
    assert not bool(plan.flips[0])
    torch.testing.assert_close(plan.flips, draws < p, rtol=0, atol=0)
