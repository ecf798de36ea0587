"""The benchmark service."""
