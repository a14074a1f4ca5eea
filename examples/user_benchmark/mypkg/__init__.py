"""A user's own package with a fedhv benchmark (examples/user_benchmark)."""
