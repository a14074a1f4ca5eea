"""Multi-task models: a shared encoder and one head per task."""

from __future__ import annotations

from fedhv.models.base import MultiTaskModel
from fedhv.models.cifar_cnn import CifarCNN
from fedhv.models.lenet import LeNetMTL
from fedhv.models.params import ParamLayout, default_init, get_flat, set_flat
from fedhv.models.resnet import ResNet18GN
from fedhv.registry import MODELS

__all__ = ["CifarCNN", "LeNetMTL", "MultiTaskModel", "ParamLayout", "ResNet18GN", "build_model", "default_init", "get_flat", "set_flat"]


MODELS.register("lenet", LeNetMTL)
MODELS.register("cifar-cnn", CifarCNN)
MODELS.register("resnet18-gn", ResNet18GN)


def build_model(model: str, num_classes: tuple[int, ...]) -> MultiTaskModel:
    """The registered model ``model`` (:data:`fedhv.registry.MODELS`) with one head per task.

    Built-ins (the paper's architectures, B.3): ``"lenet"`` (MultiMNIST, MNIST-FMNIST),
    ``"cifar-cnn"`` (CIFAR10-MNIST), ``"resnet18-gn"`` (CelebA5); a benchmark names its
    model in :attr:`fedhv.data.benchmarks.BenchmarkSpec.model`.
    """
    return MODELS.get(model)(num_classes)
