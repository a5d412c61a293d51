"""rivven_spark's public surface, and the two ways Spark finds ``format("rivven")``.

Method: ``__all__`` resolves, has no duplicates and equals the agreed set; the top-level shim
``pyspark_rivven`` exports the data source as ``DefaultSource`` (what Spark's automatic lookup
registers); ``register`` hands the class to ``spark.dataSource.register`` (checked on a fake
session object).
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

import rivven_spark  # noqa: E402

EXPECTED = {
    "RivvenDataSource", "register", "SCHEMA_DDL", "ARROW_SCHEMA", "Offsets", "OffsetRange",
    "PartitionSnapshot", "ReaderOptions", "WriterOptions", "OptionError", "DataLossError",
    "SinkTopicError", "RivvenStreamReader", "RivvenBatchReader", "RivvenInputPartition",
    "RivvenStreamWriter", "RivvenBatchWriter", "RivvenCommitMessage",
}


def test_all_is_the_agreed_surface():
    assert len(rivven_spark.__all__) == len(set(rivven_spark.__all__))
    assert set(rivven_spark.__all__) == EXPECTED
    for name in rivven_spark.__all__:
        assert getattr(rivven_spark, name) is not None


def test_the_shim_exports_the_data_source_under_its_format_name():
    import pyspark_rivven

    assert pyspark_rivven.DefaultSource is rivven_spark.RivvenDataSource
    assert pyspark_rivven.DefaultSource.name() == "rivven"


def test_register_hands_the_class_to_spark():
    registered = []

    class FakeRegistration:
        def register(self, cls):
            registered.append(cls)

    class FakeSession:
        dataSource = FakeRegistration()

    rivven_spark.register(FakeSession())
    assert registered == [rivven_spark.RivvenDataSource]
