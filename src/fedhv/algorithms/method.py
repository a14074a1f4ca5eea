"""What a federated method is: one class, in one module, holding everything about it.

A method is a frozen dataclass subclassing :class:`Method`. Its instance is what a user passes
to :func:`fedhv.simulate` (``fedhv.FSMGDA(lr_global=2.0)``); its class carries

- ``name``: the value of ``method = ...`` in a configuration, and the name of its section;
- ``section``: the frozen dataclass of its hyper-parameters -- the ``[name]`` table of a TOML
  file and the ``name.key`` of ``--set`` -- with each default written once, there, and a
  ``check()`` that refuses bad values naming ``name.key``, the value and the fix;
- ``state``: the class of its server state (``kind``, ``num_tasks``, ``to_plain`` /
  ``from_plain``), so checkpoints and ``--resume`` know it;
- ``build(context) -> Built``: its round logic (an :class:`~fedhv.algorithms.base.Algorithm`)
  for one run, from what the run's :class:`BuildContext` provides (task count, seed, the
  encoder / head split, a calibration).

:func:`register` makes the class known by ``name`` to every entry point -- ``fedhv run`` with a
TOML file, ``--set``, grids (and their worker processes), ``fedhv table``, checkpoints and the
Flower App -- through :data:`fedhv.registry.METHODS`; a package registers it for every process
with an entry point in the group ``fedhv.methods`` (``dwa = "mypkg.dwa:DWA"``).

The default :meth:`Method.from_config` / :meth:`Method.configure` assume the two fields every
built-in baseline has: ``lr_global`` (the server learning rate ``eta_g``: ``[lr.name] global`` or
``train.lr_global`` in a configuration) and ``config`` (an instance of ``section``). A method
that lays out its public fields otherwise (FedHV) overrides both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np
from typing_extensions import Self

from fedhv.algorithms.base import Algorithm
from fedhv.algorithms.tuning import LEARNING_RATES, Dimension
from fedhv.config.validation import choice, positive
from fedhv.errors import ConfigError
from fedhv.registry import METHODS

__all__ = ["BuildContext", "Built", "Calibration", "Method", "check_method_class", "choice", "positive", "register",
           "register_method"]

if TYPE_CHECKING:
    from fedhv.config.schema import RunConfig
    from fedhv.models.params import TaskSlices

M = TypeVar("M", bound="Method")


class Calibration(Protocol):
    """What a method reads of a reference calibration (paper §3.2, B.8).

    Attributes
    ----------
    reference : list of float
        ``r_i = max_{s,t} F_i^{s,t} + margin`` over the uniform-weight calibration rounds.
    max_report : list of float
        ``max_{s,t} F_i^{s,t}``.
    margin : float
        The margin ``reference`` was computed with.
    reports : dict
        The averaged reports ``F^{s,t}`` by calibration seed, round by round.
    """

    reference: list[float]
    max_report: list[float]
    margin: float
    reports: dict[str, list[list[float]]]


class BuildContext(Protocol):
    """What a run provides to :meth:`Method.build` (implemented by :mod:`fedhv.experiment.method_setup`)."""

    @property
    def num_tasks(self) -> int:
        """``m``, the number of task objectives."""

    @property
    def task_names(self) -> tuple[str, ...]:
        """The tasks' names, in objective order."""

    @property
    def seed(self) -> int:
        """The run's training seed (keys any random stream the method draws)."""

    @property
    def benchmark(self) -> str:
        """The data set's name (``data.benchmark``), for messages and paper values."""

    def task_slices(self) -> TaskSlices:
        """Encoder and head positions in the flat parameter vector.

        A user's model must hold one head per task in its ``heads`` submodule.
        """

    def calibration(self) -> Calibration:
        """The run's reference calibration: a given or shared one, else one run now."""

    def initial_losses(self) -> np.ndarray:
        """``[m]`` task losses of the initial model over all clients' training samples."""


@dataclass(frozen=True)
class Built:
    """A method's round logic for one run and what it resolved to build it.

    Attributes
    ----------
    algorithm : Algorithm
        The round logic the loop drives.
    reference : list of float or None
        A reference point the method trains against (FedHV's ``r``), recorded in ``summary.json``.
    reference_source : str or None
        Where ``reference`` came from (``"calibration"``, ``"paper Table 6"``, ``"given"``).
    calibration : Calibration or None
        The calibration the method used, written to the run's ``calibration.json``.
    """

    algorithm: Algorithm
    reference: list[float] | None = None
    reference_source: str | None = None
    calibration: Calibration | None = None


@dataclass(frozen=True)
class Method:
    """Base of every method (see the module docstring for what a subclass declares).

    Class attributes
    ----------------
    name : str
        ``method = name`` and the ``[name]`` section.
    section : type
        Frozen dataclass of the hyper-parameters (with ``check()``).
    state : type
        Server state class (``kind``, ``num_tasks``, ``to_plain``, ``from_plain``).
    needs_heads : bool
        Whether the method splits the model into encoder and task heads (``simulate(heads=)``).
    secure_aggregation : bool
        Whether its client uploads can be summed under SecAgg+ (``fedhv flower --secure``).
    """

    #: The server learning rate ``eta_g`` (``[lr.name] global`` or ``train.lr_global``).
    lr_global: float = 1.0
    name: ClassVar[str]
    section: ClassVar[type]
    state: ClassVar[type]
    needs_heads: ClassVar[bool] = False
    secure_aggregation: ClassVar[bool] = True
    #: Why SecAgg+ cannot carry the method (shown when ``secure_aggregation`` is false).
    secure_refusal: ClassVar[str] = ""
    #: Whose ``[lr.<name>]`` rates the method takes when the configuration has none of its own (issue 40:
    #: the single-trajectory methods take FedHV's preset rates); ``None``: its own only.
    rates_from: ClassVar[str | None] = None
    #: Table 12's description: (client-side procedure, per-client communication, extra server work),
    #: recorded in ``summary.json`` (the paper's four methods take the paper's entries instead).
    complexity: ClassVar[tuple[str, str, str] | None] = None
    #: The method's name in tables and figures (``"UPGrad (FSMGDA)"``), recorded in ``summary.json``;
    #: ``None``: the paper's label for its four methods, else ``name``.
    label: ClassVar[str | None] = None

    # --- configuration ---------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: RunConfig) -> Self:
        """The method object a resolved configuration describes.

        Its ``lr_global`` and, when the class has a ``config`` field, its ``[name]`` section.
        """
        kwargs: dict[str, Any] = {"lr_global": cfg.lr_global}
        if "config" in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
            kwargs["config"] = cfg.section(cls.name)
        return cls(**kwargs)

    def options(self) -> Any:
        """The object's ``[name]`` section: its ``config`` field, or the section's defaults."""
        return getattr(self, "config", None) or self.section()

    def configure(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` running this method: ``method``, ``train.lr_global`` and its ``[name]`` section."""
        train = dataclasses.replace(cfg.train, lr_global=self.lr_global)
        return dataclasses.replace(cfg, method=self.name, train=train).with_section(self.name, self.options())

    def uses_calibration(self) -> bool:
        """Whether :meth:`build` asks for a calibration (a grid then shares one per family)."""
        return False

    # --- tuning (issue 50) -----------------------------------------------------------------
    #: The dimensions of its own hyper-parameters ``fedhv tune`` searches (:mod:`fedhv.algorithms.tuning`:
    #: ``Range("mu", 0.05, 5.0, log=True, authors=(1.0,))`` for ``[name] mu``), the authors' values inside.
    tuning: ClassVar[tuple[Dimension, ...]] = ()

    @classmethod
    def search_space(cls) -> tuple[Dimension, ...]:
        """What ``fedhv tune`` searches for this method.

        Its learning rates, log-uniform from 1/4 to 4 times the setting's
        (:data:`~fedhv.algorithms.tuning.LEARNING_RATES`), then :attr:`tuning`.
        """
        return (*LEARNING_RATES, *cls.tuning)

    # --- fronts (issue 41) -----------------------------------------------------------------
    #: Whether the method's aim at a direction also takes a margin ``delta`` (FedHV's reference).
    takes_margin: ClassVar[bool] = False

    @classmethod
    def front_overrides(cls, direction: tuple[float, ...], margin: float | None = None) -> tuple[str, ...] | None:
        """Configuration overrides that aim the method at a loss-space direction (a front sweep).

        ``direction`` is ``u`` (``u_i > 0``, ``sum u = 1``; a larger ``u_i`` lets task ``i`` keep a larger
        loss); ``margin`` the sweep's ``delta`` for a method with :attr:`takes_margin`, else ``None``.
        ``None`` when the method takes no direction (a front sweep refuses it,
        :mod:`fedhv.experiment.grid_front`).
        """
        return None

    # --- the run ---------------------------------------------------------------------------
    def build(self, context: BuildContext) -> Built:
        """The round logic for one run."""
        raise NotImplementedError(f"{type(self).__name__} does not define build(context)")


def register_method(cls: Any = None, *, replace: bool = False) -> Any:
    """Register a method class under its ``name`` (a class decorator; ``fedhv.register_method``).

    ``@fedhv.register_method`` over a frozen-dataclass subclass of :class:`Method`, or
    ``fedhv.register_method(DWA)``; ``replace=True`` replaces a method of the same name. Every
    entry point then knows it by name (:data:`fedhv.registry.METHODS`).

    Raises
    ------
    ConfigError
        When ``cls`` is not a frozen-dataclass subclass of :class:`Method` with ``name``, a
        dataclass ``section`` with ``check()`` and a ``state`` with ``kind``, ``to_plain`` and
        ``from_plain``, when its name is a top-level configuration key, or when the name is taken.
    """
    if cls is None:
        return lambda c: register_method(c, replace=replace)
    if isinstance(cls, str):
        raise ConfigError(f"register_method({cls!r}, ...): a method registers its class, whose name is its "
                          "class attribute `name`; write @fedhv.register_method over the class")
    check_method_class(cls)
    METHODS.register(cls.name, cls, replace=replace)
    return cls


#: The decorator the built-in methods use (``register_method`` without options).
register = register_method


def check_method_class(cls: Any) -> Any:
    """``cls`` if it is a usable method class; else a one-line :class:`ConfigError` naming what is missing."""
    what = getattr(cls, "__name__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ConfigError(f"{what} is not a method class; subclass fedhv.Method (a frozen dataclass) and "
                          "register the class (not an instance or a function)")
    missing = [a for a in ("name", "section", "state") if not hasattr(cls, a)]
    if missing:
        raise ConfigError(f"method class {what} lacks the class attribute(s) {', '.join(missing)}; "
                          "see docs/methods.md, 'Write your own method'")
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise ConfigError(f"method class {what} must be a frozen dataclass: decorate it with "
                          "@dataclass(frozen=True)")
    if not (dataclasses.is_dataclass(cls.section) and callable(getattr(cls.section, "check", None))):
        raise ConfigError(f"{what}.section must be a dataclass with a check() method (its [{cls.name}] section)")
    if not all(hasattr(cls.state, a) for a in ("kind", "to_plain", "from_plain")):
        raise ConfigError(f"{what}.state must have kind, to_plain and from_plain (checkpoints need them)")
    from fedhv.config.schema import RunConfig

    if cls.name in {f.name.rstrip("_") for f in dataclasses.fields(RunConfig)}:
        raise ConfigError(f"method name {cls.name!r} is a top-level configuration key, so [{cls.name}] could not be "
                          "its section; choose another name")
    return cls
