"""FedHV as a Flower Baseline: client_app, server_app, dataset (Flower Datasets), model, strategy."""
