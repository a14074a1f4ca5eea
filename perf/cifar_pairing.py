"""The pairing test of the CIFAR10–MNIST gap (issue 31): does the image–digit pairing carry information?

    FEDHV_DATA=../shared/data python perf/cifar_pairing.py RUN_DIR [--seeds 0,1,2]

CIFAR10–MNIST pastes MNIST digit ``i mod 60,000`` (``10,000`` in the test split) onto CIFAR-10
image ``i`` (:mod:`fedhv.data.cifar_mnist`). The workplace CIFAR-10 copy is an image folder read
in class-sorted order, so each CIFAR class meets a fixed block of MNIST images: in the test split
class ``c`` gets MNIST test images ``1000c .. 1000c + 999``, and the two halves of MNIST's test set
come from different writer populations (LeCun et al., 1998). A model that learned the pairing
would lose accuracy when the same CIFAR test images get their digits from a seeded permutation of
the MNIST test images instead. This evaluates the run's final ``model.pt`` on the test set as
built and on re-paired test sets (one per seed) and prints the per-task accuracy of each.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from fedhv.config.loader import config_from_toml_text
from fedhv.data.cifar import load_cifar10
from fedhv.data.cifar_mnist import overlay_digits
from fedhv.data.federated import to_tensor_images
from fedhv.data.idx import load_mnist
from fedhv.experiment.setup import federated_data, new_model
from fedhv.metrics.evaluate import evaluate_tasks
from fedhv.registry import BENCHMARKS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the MNIST test permutations")
    args = parser.parse_args()
    run = Path(args.run_dir)
    cfg = config_from_toml_text((run / "config.toml").read_text())
    if cfg.data.benchmark != "cifar10-mnist":
        raise SystemExit(f"{run}: a {cfg.data.benchmark} run; give a cifar10-mnist run directory")
    spec = BENCHMARKS.get("cifar10-mnist")
    cifar, mnist = load_cifar10(cfg.data.root, False), load_mnist(cfg.data.root, False)
    cx, cy = cifar["test"]
    mx, my = mnist["test"]
    data = federated_data(cfg)  # the model's shapes; the test tensors are built below
    model = new_model(cfg, data, cfg.seed)
    state = torch.load(run / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    getattr(model, "module", model).load_state_dict(state)
    model.eval()
    rows = {}
    for name, seed in [("as built (digit i for image i)", None)] + [
            (f"re-paired, permutation seed {s}", int(s)) for s in args.seeds.split(",")]:
        idx = np.arange(len(cx)) % len(mx) if seed is None else np.random.default_rng(seed).permutation(len(mx))[
            np.arange(len(cx)) % len(mx)]
        x = to_tensor_images(overlay_digits(cx, mx[idx]), spec.mean, spec.std, torch.float32, "cpu")
        y = torch.from_numpy(np.stack([cy, my[idx]], axis=1))
        acc, loss = evaluate_tasks(model, x, y, 1000, data.objective)
        rows[name] = {"task_acc": acc, "task_loss": loss}
        print(f"{name}: CIFAR-10 {acc[0]:.2f} %, digit {acc[1]:.2f} %, losses {loss[0]:.4f} / {loss[1]:.4f}", flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
