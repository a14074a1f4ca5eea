"""Real federated runs on Flower (``pip install 'fedhv[flower]'``, flwr 1.42).

Every ``flwr`` import of fedhv lives in this package, and only the modules that need it
import it: ``node`` (a SuperNode's computation) does not, the others do.

- :mod:`fedhv.flower.protocol`: the records of each message;
- :mod:`fedhv.flower.client`: the ``ClientApp`` (``fedhv.flower.client:app``);
- :mod:`fedhv.flower.federation`: the ``Federation`` over a ``Grid``;
- :mod:`fedhv.flower.app`: the one ``ServerApp`` (``fedhv.flower.app:server_app``, for ``flwr run``
  of the App and ``fedhv flower local`` alike) and the App's ClientApp;
- :mod:`fedhv.flower.server`: the server side of a run (the federation factory, progress lines);
- :mod:`fedhv.flower.secure` / :mod:`fedhv.flower.secure_client`: secure aggregation (SecAgg+),
  the server's and the node's side;
- :mod:`fedhv.flower.executor`: a long-lived ClientApp process (``--isolation process``);
- :mod:`fedhv.flower.local`: ``fedhv flower local``;
- :mod:`fedhv.flower.certs`: test TLS certificates and SuperNode authentication keys;
- :mod:`fedhv.flower.partitioner`: the paper's partition as a Flower Datasets ``Partitioner``
  (``flwr_datasets`` only, no ``flwr``: the ``hf`` extra suffices).
"""

from __future__ import annotations

import warnings

from fedhv.errors import FedHVError


class FlowerMissing(FedHVError):
    """``flwr`` is not installed."""


def require_flwr() -> None:
    """Raise :class:`FlowerMissing` (one line, with the fix) unless ``flwr`` can be imported."""
    try:
        with warnings.catch_warnings():  # flwr's typer import warns of click deprecations
            warnings.simplefilter("ignore", DeprecationWarning)
            import flwr  # noqa: F401
    except ImportError:
        raise FlowerMissing("the Flower back-end needs flwr: pip install 'fedhv[flower]' (flwr==1.42.0)") from None
