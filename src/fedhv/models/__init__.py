"""Multi-task models: a shared encoder and one head per task."""

from __future__ import annotations

from fedhv.models.base import MultiTaskModel
from fedhv.models.cifar_cnn import CifarCNN
from fedhv.models.lenet import LeNetMTL
from fedhv.models.params import ParamLayout, default_init, get_flat, set_flat
from fedhv.models.resnet import ResNet18GN

__all__ = ["CifarCNN", "LeNetMTL", "MultiTaskModel", "ParamLayout", "ResNet18GN", "build_model", "default_init", "get_flat", "set_flat"]


def build_model(benchmark: str, num_classes: tuple[int, ...]) -> MultiTaskModel:
    """The paper's architecture for a benchmark family (B.3)."""
    if benchmark in ("multimnist", "mnist-fmnist"):
        return LeNetMTL(num_classes)
    if benchmark.startswith("cifar10-mnist"):
        return CifarCNN(num_classes)
    if benchmark == "celeba5":
        return ResNet18GN(num_classes)
    raise ValueError(f"no model for benchmark {benchmark!r}")
