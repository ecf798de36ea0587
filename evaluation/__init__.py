"""The evaluation library: benchmarks, importers, scorers, the code executor and the engines.

Usable without NATS (``ftbus score``, ``ftbus benchmarks``); the benchmark stage
(``services/benchmark/``) is a handler over it.
"""
