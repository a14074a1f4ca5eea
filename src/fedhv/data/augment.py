"""Training-batch augmentation specification (applied by the engines, never to
evaluation or report data)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Augment:
    """Per-sample rotation and per-batch horizontal flip.

    Attributes
    ----------
    rotation_degrees : float
        Angles uniform in ``[-deg, deg)`` (``integer_angles``: uniform integers in
        ``[-deg, deg]``); 0 disables rotation.
    integer_angles : bool
        Draw whole-degree angles (CIFAR10-MNIST reference code).
    interpolation : {"bilinear", "nearest"}
        ``grid_sample`` mode; padding is zero in normalised space.
    flip_prob : float
        Probability that a whole minibatch is flipped horizontally (one draw per batch,
        as in the reference code's CIFAR10-MNIST train loop).
    """

    rotation_degrees: float = 0.0
    integer_angles: bool = False
    interpolation: str = "bilinear"
    flip_prob: float = 0.0

    @property
    def active(self) -> bool:
        return self.rotation_degrees > 0 or self.flip_prob > 0
