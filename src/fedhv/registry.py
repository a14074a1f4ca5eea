"""Registries: benchmarks, models and methods by name, and user benchmarks by ``module:attr``.

Three :class:`Registry` instances hold everything a configuration can name:

- :data:`BENCHMARKS` -- ``data.benchmark``: a built-in
  :class:`~fedhv.data.benchmarks.BenchmarkSpec` (source data sets, builder, task names,
  classes, normalisation, augmentation, objective, model name), or a user's factory
  ``() -> fedhv.UserBenchmark``;
- :data:`MODELS` -- model name -> ``factory(num_classes) -> nn.Module``;
- :data:`METHODS` -- ``method``: name -> method class (a :class:`fedhv.Method` subclass holding
  its hyper-parameter section, state and round logic; :mod:`fedhv.algorithms.method`).

Built-ins register themselves through the same :meth:`Registry.register` when their
module is imported; a registry imports that module on its first lookup, so this module
(and :mod:`fedhv.config.schema`) never imports torch by itself. Installed packages add
entries through entry points (groups ``fedhv.benchmarks``, ``fedhv.models``,
``fedhv.methods``), loaded when first named, so every process -- grid workers included --
knows them without registering anything in Python.

``data.benchmark = "mypkg.tasks:make_benchmark"`` (a ``module:attribute`` value) names a
user benchmark without registering it: :func:`resolve_benchmark` imports the module on
use and returns the attribute.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

from fedhv.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind.

    Parameters
    ----------
    kind : str
        What the entries are (``"benchmark"``), for messages.
    key : str
        The configuration key that names an entry (``"data.benchmark"``), for messages.
    builtins : str
        Module that registers the built-in entries; imported on the first lookup.
    how : str
        How a user adds an entry, for the unknown-name message.
    """

    def __init__(self, kind: str, key: str, builtins: str, how: str) -> None:
        self.kind, self.key, self._builtins, self._how = kind, key, builtins, how
        self._items: dict[str, T] = {}
        self._entry_points: dict[str, importlib.metadata.EntryPoint] = {}
        self._loaded = False

    @property
    def group(self) -> str:
        """The entry-point group installed packages register in (``fedhv.benchmarks``, ...)."""
        return f"fedhv.{self.kind}s"

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # set first: the built-ins module registers through register()
        try:
            importlib.import_module(self._builtins)
        except BaseException:
            self._loaded = False
            raise
        # Installed packages' entries (``[project.entry-points."fedhv.benchmarks"]``), loaded on
        # first use: every process sees them (grid workers too), nothing is imported until named.
        for ep in importlib.metadata.entry_points(group=self.group):
            if ep.name not in self._items and ":" not in ep.name and ep.name.strip():
                self._entry_points.setdefault(ep.name, ep)

    def _from_entry_point(self, name: str) -> T:
        ep = self._entry_points.pop(name)
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - any failure is the installed package's; one line
            detail = (str(exc).strip().splitlines() or [""])[0]
            self._entry_points[name] = ep
            raise ConfigError(f"{self.key} = {name!r}: the entry point {ep.value!r} (group {self.group}, package "
                              f"{ep.dist.name if ep.dist else '?'}) cannot be loaded ({type(exc).__name__}: "
                              f"{detail}); fix or reinstall that package") from None
        self._items[name] = obj
        return obj

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T, *, replace: bool = False) -> T: ...

    def register(self, name: str, obj: T | None = None, *, replace: bool = False) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, a decorator that does so.

        Raises
        ------
        ConfigError
            For an empty name, a name with ``':'`` (reserved for ``module:attr``), or a
            name already taken (unless ``replace=True``).
        """
        if not isinstance(name, str) or not name.strip() or ":" in name:
            raise ConfigError(f"{self.kind} name {name!r} is not usable; give a non-empty name without ':' "
                              "(':' marks a module:attribute value)")
        self._load()

        def add(entry: T) -> T:
            if name in self._items and self._items[name] is not entry and not replace:
                raise ConfigError(f"{self.kind} {name!r} is already registered; choose another name or pass "
                                  "replace=True")
            self._items[name] = entry
            return entry

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (no error when absent)."""
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        """The entry registered as ``name``.

        Raises
        ------
        ConfigError
            One line naming the key, the value, the known names and the fix.
        """
        self._load()
        if name in self._items:
            return self._items[name]
        if name in self._entry_points:
            return self._from_entry_point(name)
        known = [*self._items, *self._entry_points]
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{self.key} = {name!r} is not supported{hint}; choose one of {', '.join(known)}"
            + f", or {self._how}"
        )

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order (built-ins first), then installed packages' entry points."""
        self._load()
        return (*self._items, *(n for n in self._entry_points if n not in self._items))

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered or an installed entry point."""
        self._load()
        return name in self._items or name in self._entry_points

    def __getitem__(self, name: str) -> T:
        """The entry ``name`` (:meth:`get`)."""
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        """The names, as :meth:`names`."""
        return iter(self.names())


BENCHMARKS: Registry[Any] = Registry(
    "benchmark", "data.benchmark", "fedhv.data.benchmarks",
    "register one with fedhv.register_benchmark(name, factory), or name a factory as 'module:attribute'")
MODELS: Registry[Callable[[tuple[int, ...]], Any]] = Registry(
    "model", "model", "fedhv.models", "register one with fedhv.register_model(name, factory)")
METHODS: Registry[Any] = Registry(
    "method", "method", "fedhv.algorithms",
    "register a method class with @fedhv.register_method (docs/methods.md, 'Write your own method')")


def register_benchmark(name: str, factory: Any = None, *, replace: bool = False) -> Any:
    """Register a benchmark: ``factory() -> fedhv.UserBenchmark`` (decorator without ``factory``)."""
    return BENCHMARKS.register(name) if factory is None else BENCHMARKS.register(name, factory, replace=replace)


def register_model(name: str, factory: Any = None, *, replace: bool = False) -> Any:
    """Register a model: ``factory(num_classes) -> nn.Module`` (decorator without ``factory``)."""
    return MODELS.register(name) if factory is None else MODELS.register(name, factory, replace=replace)


def is_reference(value: str) -> bool:
    """``value`` is a ``module:attribute`` reference rather than a registered name."""
    return ":" in value


def resolve_benchmark(value: str) -> Any:
    """The registered entry ``value``, or the attribute a ``module:attr`` value names.

    The module is imported on use (it must be importable: on ``PYTHONPATH`` or installed).

    Raises
    ------
    ConfigError
        Unknown name, unimportable module, missing attribute or an attribute that is not
        callable; each names ``data.benchmark``, the value and the fix.
    """
    if not is_reference(value):
        return BENCHMARKS.get(value)
    module_name, _, attr = value.partition(":")
    where = f"data.benchmark = {value!r}"
    if not module_name or not attr:
        raise ConfigError(f"{where} is not 'module:attribute'; write it like \"mypkg.tasks:make_benchmark\"")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module's; one line
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"{where}: module {module_name!r} cannot be imported ({type(exc).__name__}: {detail}); "
                          "put its folder on PYTHONPATH or pip install its package") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}; name the function "
                              "that returns a fedhv.UserBenchmark, e.g. 'mypkg.tasks:make_benchmark'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{where}: {attr!r} is a {type(obj).__name__}, not callable; name a function "
                          "() -> fedhv.UserBenchmark")
    return obj


def __getattr__(name: str) -> Any:
    # ``register_method`` lives with the method contract (fedhv.algorithms.method), a layer above.
    if name == "register_method":
        return importlib.import_module("fedhv.algorithms.method").register_method
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
