"""A user's own Flower App: a two-task model on synthetic non-IID data, trained with fedhv's
:class:`~fedhv.flower.strategy.FedHVStrategy` (server) and :func:`~fedhv.flower.strategy.fedhv_reply`
(client). Nothing here is a fedhv setting: the model, the tasks and the data are the app's own."""
