"""Spark's automatic lookup of ``format("rivven")``: a one-line shim.

On its first Python data-source lookup, PySpark (4.x) imports every top-level module whose
name starts with ``pyspark_`` and registers the ``DefaultSource`` it exports. This module
exists only for that; the source lives in ``rivven_spark``.
"""

from rivven_spark.source import RivvenDataSource as DefaultSource

__all__ = ["DefaultSource"]
