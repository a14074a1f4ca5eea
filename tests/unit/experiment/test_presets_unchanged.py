"""Every preset, every method, in float64: the results recorded before the renovation (issue 39).

The values were recorded by the code at 5ad2068 (before a method became one module and the run one
composition root): two rounds of each built-in method on each preset whose data ships with the
repository's data folder, shrunk (6 clients, 64 samples each, 2 local steps, one calibration round,
200 test samples, no augmentation; the cross-device preset with 40 clients of 32 samples), in float64.
On the machine that recorded them the code after the renovation reproduced all 20 exactly (final
task losses, the sum and the squared norm of the final model); across machines float64 kernels may
differ in the last bits, hence ``rtol = 1e-9``. A change of the maths, of a default, of the order of
random draws or of what a preset means moves these values far beyond that.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhv.config import load_config
from fedhv.experiment.runner import run_experiment

SMALL = ["partition.clients=6", "partition.samples_per_client=64", "train.clients_per_round=4", "train.batch_size=16",
         "train.local_steps=2", "calibration.rounds=1", "data.max_test_samples=200", "eval.test_period=1",
         "rounds=2", "dtype='float64'", "data.augment=false"]
CROSS_DEVICE = ["partition.clients=40", "train.clients_per_round=4", "partition.samples_per_client=32"]

#: ``preset/method``: (final task losses, sum of the final model, its squared norm), recorded at 5ad2068.
RECORDED: dict[str, tuple[list[float], float, float]] = {
    "multimnist/uniform": ([2.3004268587980237, 2.2990531879570035], 1.095914987494358, 66.62826966615745),
    "multimnist/fedhv": ([2.3006198294607603, 2.2992455556859324], 0.22489032669968712, 66.63053101941264),
    "multimnist/fsmgda": ([2.301349994901813, 2.2997539239444573], 3.904386725747575, 66.6720831076449),
    "multimnist/fedcmoo": ([2.309840014459202, 2.294691265691389], -3.173999720435475, 66.73713649112169),
    "multimnist-xd/uniform": ([2.3016713722188133, 2.303319531868945], 4.251002796135515, 66.65316593643956),
    "multimnist-xd/fedhv": ([2.3019626159742894, 2.3026128158202237], 2.337959645321181, 66.63922675398415),
    "multimnist-xd/fsmgda": ([2.301831524378989, 2.3091498261970784], 6.414829600881752, 66.69510583203383),
    "multimnist-xd/fedcmoo": ([2.3004592826013446, 2.3121308374305083], -0.07329134136712323, 66.68657346343525),
    "mnist-fmnist/uniform": ([2.3009223961457503, 2.302384348025621], 3.5634392982486887, 66.62873093764541),
    "mnist-fmnist/fedhv": ([2.3026368117680565, 2.302570667187861], 4.855863737420422, 66.66311705283461),
    "mnist-fmnist/fsmgda": ([2.2997181491704755, 2.2982325436744127], 5.112582003694781, 66.62572967991426),
    "mnist-fmnist/fedcmoo": ([2.302010655792115, 2.299649975581996], 3.778327034210428, 66.64295440855116),
    "cifar10-mnist-a/uniform": ([2.3322723505160936, 2.358563377707597], 19.721483211482695, 310.9525606734003),
    "cifar10-mnist-a/fedhv": ([2.329975930485952, 2.347381392790089], 11.48177716787157, 310.8996198675038),
    "cifar10-mnist-a/fsmgda": ([2.3032423791813654, 2.318317397538829], 7.361083697464258, 310.5756564214232),
    "cifar10-mnist-a/fedcmoo": ([2.32580587170187, 2.3715400105459135], 43.339410742057424, 311.0368920501844),
    "cifar10-mnist-b/uniform": ([2.3046206117437453, 2.299592779364221], -6.823293865830717, 310.67563999863415),
    "cifar10-mnist-b/fedhv": ([2.3034204980882396, 2.299480871771425], -7.981264601231215, 310.65702338035874),
    "cifar10-mnist-b/fsmgda": ([2.3019369151466975, 2.301915044489687], -9.309927736758299, 310.6351059329246),
    "cifar10-mnist-b/fedcmoo": ([2.306997636509324, 2.29951752625477], 21.316753134741628, 310.77251961721646),
}


def _overrides(preset: str, method: str) -> list[str]:
    over = [*SMALL, f"method='{method}'"]
    if preset == "multimnist-xd":
        keep = ("partition.clients", "partition.samples", "train.clients_per")
        over = [o for o in over if not o.startswith(keep)] + CROSS_DEVICE
    return over


@pytest.mark.deploy
@pytest.mark.needs_data
@pytest.mark.parametrize("key", sorted(RECORDED))
def test_preset_and_method_reproduce_the_values_recorded_before(key: str, tmp_path: Path) -> None:
    preset, method = key.split("/")
    summary = run_experiment(load_config(preset, _overrides(preset, method)), tmp_path / "run", progress=False)
    state = torch.load(tmp_path / "run" / "model.pt", weights_only=True)["state_dict"]
    theta = torch.cat([v.reshape(-1).double() for v in state.values()])
    losses, total, square = RECORDED[key]
    assert summary["task_loss"] == pytest.approx(losses, rel=1e-9, abs=0)
    assert float(theta.sum()) == pytest.approx(total, rel=1e-9, abs=1e-12)
    assert float((theta * theta).sum()) == pytest.approx(square, rel=1e-9, abs=0)
