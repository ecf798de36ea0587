"""The aggregator service."""
