"""Single-machine federated simulator: client plans and execution engines."""
