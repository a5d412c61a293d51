"""The exactly-once surface is deliberate: producer state, transactions, the aborted index.

Method: pin ``__all__`` of each exactly-once module (the package ``__init__`` re-exports are
pinned with the rest of the package), check every listed name resolves, and check each
module says what it owns: a "Theory of operation" docstring and a size under the house limit.
"""

from __future__ import annotations

import importlib
import pathlib

import pytest

EXPECTED = {
    "rivven_broker.storage.producer_state": """SEQUENCE_MAX NO_OFFSET increment_sequence
        BatchMetadata ProducerInfo Verdict CompletedTxn CorruptSnapshotError
        ProducerStateManager""",
    "rivven_broker.coordinator.transaction_coordinator": "FIRST_PRODUCER_ID TransactionCoordinator",
    "rivven_broker.coordinator.txn_events": """TxnRequest TxnRequestReceived TxnLogAppended
        TxnLogAppendFailed MarkersWritten TxnTick TxnEvent TxnReply AppendTxnLog WriteMarkers
        TxnInstruction ProducerIdsGranted RequestProducerIds""",
    "rivven_broker.coordinator.txn_requests": "error_response add_partitions add_group "
    "commit_offsets",
    "rivven_broker.coordinator.txn_log_codec": """TRANSACTION_STATE_TOPIC TxnState PendingOffset
        TxnMetadata ProducerIdBlock TxnTombstone CorruptTxnRecordError encode_txn_key
        encode_txn_metadata encode_txn_tombstone encode_producer_id_block decode_txn_record
        transaction_partition_for""",
    "rivven_broker.storage.txn_index": """TXN_INDEX_FILE ENTRY_BYTES FILE_HEADER_BYTES AbortedTxn
        AbortedTxnIndex TxnIndexFile encode_entry decode_index""",
    "rivven_broker.protocol.txn_messages": """NO_PRODUCER_ID NO_PRODUCER_EPOCH InitProducerId
        InitProducerIdResponse AddPartitionsToTxn AddPartitionsToTxnTopic
        AddPartitionsToTxnResponse AddPartitionsToTxnTopicResponse
        AddPartitionsToTxnPartitionResponse AddOffsetsToTxn AddOffsetsToTxnResponse
        TxnOffsetCommit TxnOffsetCommitTopic TxnOffsetCommitPartition TxnOffsetCommitResponse
        TxnOffsetCommitTopicResponse TxnOffsetCommitPartitionResponse EndTxn EndTxnResponse""",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_module_pins_its_api_and_says_what_it_owns(name):
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(EXPECTED[name].split())
    for exported in module.__all__:
        assert getattr(module, exported, None) is not None, (name, exported)
    assert module.__doc__ and "Theory of operation" in module.__doc__, name
    lines = pathlib.Path(module.__file__).read_text().count("\n")
    assert lines < 650, f"{name} has {lines} lines"
