"""The Federation protocol declares what the round loop reads, and every back-end satisfies it.

``fedhv.experiment.loop.run_rounds`` reads a round's books (bytes, stages, client time,
dropped / rejected / diverged clients, ``extras``) from the federation and sets its
``global_buffers``; ``Federation`` (``fedhv.algorithms.base``, runtime-checkable) declares
all of them, so a back-end lacking one is not a ``Federation`` (issue 39, item 4).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedhv.algorithms.base import Federation
from fedhv.sim.federation import SimFederation

#: What the round loop reads from (or sets on) a federation besides the algorithm-facing calls.
LOOP_READS = ("bytes_down", "bytes_up", "stages", "client_seconds", "dropped", "rejected", "diverged", "extras",
              "global_buffers")


def test_the_protocol_declares_every_attribute_the_round_loop_reads() -> None:
    declared = set(Federation.__annotations__) | {"clients", "exchange", "count_uplink", "count_downlink", "relay"}
    assert set(LOOP_READS) <= declared


def test_the_simulator_federation_is_a_federation() -> None:
    fed = SimFederation(engine=None, clients=np.arange(3), round_idx=0)  # type: ignore[arg-type]
    assert isinstance(fed, Federation)
    assert fed.extras == {} and fed.global_buffers is None  # the simulator adds no back-end facts


def test_the_flower_federations_are_federations() -> None:
    pytest.importorskip("flwr")
    from fedhv.config.flower import FlowerConfig
    from fedhv.flower.federation import FlowerFederation
    from fedhv.flower.secure import SecureFlowerFederation

    plain = FlowerFederation(object(), object(), np.arange(3), 0, 1, "train", "sha", 2)  # type: ignore[arg-type]
    secure = SecureFlowerFederation(object(), object(), np.arange(3), 0, 1, "train", "sha", 2,  # type: ignore[arg-type]
                                    FlowerConfig())
    assert isinstance(plain, Federation) and isinstance(secure, Federation)


def test_an_object_missing_a_book_the_loop_reads_is_not_a_federation() -> None:
    fed: Any = SimFederation(engine=None, clients=np.arange(3), round_idx=0)  # type: ignore[arg-type]
    del fed.extras
    assert not isinstance(fed, Federation)
