"""The data service."""
