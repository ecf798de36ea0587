"""Chaos suite: a 3-node nats-server cluster, workers and clients under scheduled faults, and a
checker that sorts every request into ok, lost, duplicated or wrong (`make chaos`, docs/operations.md)."""
