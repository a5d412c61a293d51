"""Rivven for Python: the broker, its wire protocol, record batches, storage and clients."""

__version__ = "0.1.0"
