"""Fuzzing the config loader: any override is either accepted or rejected with a ConfigError."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fedhv.config import load_config
from fedhv.errors import ConfigError

KEYS = [
    "rounds", "seed", "method", "engine", "dtype", "engine_chunk", "partition.alpha", "partition.clients",
    "partition.samples_per_client", "partition.strata", "train.local_steps", "train.batch_size",
    "train.clients_per_round", "train.momentum", "train.lr_local", "fedhv.rho_clip", "fedhv.report_batches",
    "fedhv.reference", "calibration.seeds", "calibration.margin", "eval.splits", "eval.test_period",
    "fedcmoo.estimator", "data.flip_prob", "nonsense.key", "train", "lr.fedhv.global",
]
VALUES = st.one_of(
    st.integers(-5, 50).map(str), st.floats(-2, 2).map(repr), st.sampled_from(
        ["'all'", "'x'", "[1.0, 2.0]", "[]", "true", "uniform", "\"batched\"", "{a = 1}", "[0, 42]", "inf", "nan"]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=4))
def test_overrides_never_crash(pairs: list[tuple[str, str]]) -> None:
    try:
        cfg = load_config("multimnist", [f"{k}={v}" for k, v in pairs])
    except ConfigError as exc:
        assert str(exc)
        return
    assert cfg.rounds >= 1 and cfg.lr_global > 0 and cfg.fedhv.rho_clip > 0
    assert all(math.isfinite(v) for v in (cfg.calibration.margin, cfg.train.momentum, cfg.partition.alpha))


def test_non_finite_numbers_are_rejected() -> None:
    import pytest

    for item in ("calibration.margin=nan", "train.lr_local=inf", "fedhv.reference=[2.5, nan]"):
        with pytest.raises(ConfigError, match="finite|wrong type"):
            load_config("multimnist", [item])
