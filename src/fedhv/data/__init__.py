"""Data: benchmark readers, derived-data caches, client partitions, user data, data named by a configuration."""
