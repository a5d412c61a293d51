"""Every bound of the system, in one place.

Theory of operation
-------------------
TigerBeetle's rule: put a limit on everything, keep the limits together, and assert how they
relate. Every queue, batch, list, name, retry and wait in Rivven takes its bound from here, so a
reader can see the worst case of the whole system on one page. Units and qualifiers come last
(``frame_bytes_max``, ``idle_timeout_ms``). Values are plain module constants (no I/O, no
configuration parsing); broker configuration may lower a limit, never raise it above these.
"""

from __future__ import annotations

# --- framing -------------------------------------------------------------------------------
#: Bytes before the payload: u32 length, u8 format, u32 correlation id.
frame_header_bytes = 9
#: Largest frame (everything after the length prefix) a peer may send or receive.
frame_bytes_max = 64 * 1024 * 1024
#: Largest frame the broker sends in answer to a fetch (responses are bounded too).
response_bytes_max = frame_bytes_max

# --- names and lists -----------------------------------------------------------------------
topic_name_bytes_max = 249  # Kafka's bound: a directory name plus a partition suffix fits.
group_id_bytes_max = 256
client_id_bytes_max = 256
config_key_bytes_max = 256
config_value_bytes_max = 4096
list_length_max = 10_000  # topics, partitions, configs ... in one request or response
partitions_per_topic_max = 1000
#: Partitions of all topics together that clients may have the broker create (CreateTopic,
#: CreatePartitions, auto-creation answer INVALID_PARTITIONS beyond); the broker's own topics
#: count but are never refused. Each partition costs memory and files, not descriptors.
partitions_per_broker_max = 10_000
replication_factor_max = 16
headers_per_record_max = 1024
#: Structural bound on a topic name, group id, transactional id, rack or cluster id inside a
#: message. The semantic rules (249 bytes, legal characters: ``protocol/names.py``) are the
#: broker's to apply, per topic, with INVALID_TOPIC_NAME; the codec only refuses absurd sizes.
wire_name_bytes_max = 1024
#: Longest human-readable error message carried in a response.
error_message_bytes_max = 4096
#: Longest host name in broker metadata (DNS: 253, plus room for an IPv6 literal).
host_bytes_max = 255

# --- record batches ------------------------------------------------------------------------
batch_bytes_max = 16 * 1024 * 1024  # one record batch, compressed
batch_records_max = 1_000_000
max_message_bytes_default = 8 * 1024 * 1024  # topic config `max.message.bytes` default

# --- produce / fetch -----------------------------------------------------------------------
produce_timeout_ms_max = 300_000
fetch_wait_ms_max = 30_000
fetch_bytes_max = 52_428_800  # per response, like Kafka's fetch.max.bytes
fetch_partition_bytes_max = 16 * 1024 * 1024

# --- connections ---------------------------------------------------------------------------
connections_max = 10_000
in_flight_requests_per_connection_max = 64
idle_timeout_ms = 120_000  # a silent client is closed after this
handshake_timeout_ms = 10_000
#: A frame (or an HTTP request head) must be complete this long after its first byte.
request_timeout_ms_default = 30_000
request_timeout_ms_max = 300_000
#: Bytes of unfinished request frames the broker buffers at once, all connections together
#: (Kafka's queued.max.request.bytes). When spent, connections stop reading until it frees.
queued_request_bytes_max_default = 128 * 1024 * 1024
queued_request_bytes_max = 16 * 1024 * 1024 * 1024
#: HTTP connections (/health, /metrics, the dashboard) open at once.
http_connections_max_default = 64
http_connections_max = 1024

# --- storage -------------------------------------------------------------------------------
index_interval_bytes = 4096
segment_bytes_default = 1024 * 1024 * 1024
segment_bytes_min = 1024
segment_ms_default = 7 * 24 * 3600 * 1000
retention_ms_default = 7 * 24 * 3600 * 1000
sync_group_bytes_max = 4 * 1024 * 1024  # one group commit covers at most this much new data
#: A group commit of at least this many files makes them durable with one file-system-wide
#: sync (``FileStore.sync_filesystem``: ``syncfs(2)``) when the store offers one, instead of
#: an fsync per file. 51 files: ~2 ms and 0.2 ms of CPU against ~4 ms and 1.7 ms on 8
#: threads (quiet host), 4.9 against 17.8 ms under other tenants' writes; 16 files under
#: those writes: 3.1 against 3.0 ms, and a 16-partition produce ran 12-17 % slower with it
#: (syncfs also writes back what others wrote): so only for groups well past that.
sync_filesystem_files_min = 32
#: The background scrubber checks sealed segments' CRCs this many bytes per step, and at most
#: ``scrub_bytes_per_second_default`` bytes a second unless configured (0: off).
#: A file of this many bytes kept in the data directory: given up on a full disk so the topic
#: registry can still be rewritten (a topic deleted to free space), taken again once room returns.
space_reserve_bytes = 1024 * 1024
scrub_chunk_bytes = 256 * 1024
#: Segment and index files the storage layer keeps open (an LRU; more are reopened on use).
open_files_min = 8  # the simulator runs with 8, so every run crosses evictions
open_files_max = 100_000
scrub_bytes_per_second_default = 4 * 1024 * 1024

# --- consumer groups (protocol/group_messages.py, coordinator/) ------------------------------
#: Member ids are chosen by the broker (client id prefix + 32 hex digits); the bound is loose.
member_id_bytes_max = 512
group_instance_id_bytes_max = 256
#: Protocol type ("consumer") and assignor names ("range", "cooperative-sticky", ...).
group_protocol_name_bytes_max = 256
#: Assignors a member may offer in one JoinGroup.
group_protocols_max = 32
#: Members of one group (Kafka's group.max.size); more joins get GROUP_MAX_SIZE_REACHED.
group_members_max = 1000
session_timeout_ms_min = 1_000  # Kafka's group.min.session.timeout.ms is 6 s; ours is lower
session_timeout_ms_max = 300_000
session_timeout_ms_default = 10_000
rebalance_timeout_ms_default = 30_000
rebalance_timeout_ms_max = 300_000
#: How long a round that starts from an empty group waits for more members before it closes.
initial_rebalance_delay_ms_default = 3_000
#: Metadata string of one committed offset (Kafka's offset.metadata.max.bytes).
offset_metadata_bytes_max = 4096
offsets_retention_ms_default = 7 * 24 * 3600 * 1000  # offsets.retention.minutes = 10080
offsets_retention_check_interval_ms = 600_000
#: Distinct keys one compaction run remembers (Kafka bounds its offset map by memory); a
#: partition with more keys is cleaned in several runs, oldest segments first.
compaction_keys_max = 1_000_000

assert frame_header_bytes == 4 + 1 + 4
assert batch_bytes_max < frame_bytes_max
assert fetch_partition_bytes_max <= fetch_bytes_max
assert fetch_bytes_max < response_bytes_max
assert max_message_bytes_default <= batch_bytes_max
assert in_flight_requests_per_connection_max > 0
assert 0 < request_timeout_ms_default <= request_timeout_ms_max
assert queued_request_bytes_max_default <= queued_request_bytes_max
assert http_connections_max_default <= http_connections_max
assert topic_name_bytes_max <= wire_name_bytes_max
assert group_id_bytes_max <= wire_name_bytes_max
assert config_value_bytes_max <= frame_bytes_max
assert index_interval_bytes > 0
assert segment_bytes_min <= segment_bytes_default

# --- idempotent producers and transactions (storage/producer_state.py, transactions) ---
#: Batches remembered per producer per partition for duplicate detection (Kafka's 5; a
#: producer keeps at most this many requests in flight per partition).
producer_batches_retained = 5
#: Producer epochs are i16 on disk; a transactional id whose epoch would pass this gets a
#: new producer id at epoch 0.
producer_epoch_max = 2**15 - 1
#: A producer with no open transaction and no write for this long is forgotten by a partition.
producer_id_expiration_ms = 7 * 24 * 3600 * 1000
#: Producer ids reserved per durable allocation record in ``__transaction_state``.
producer_id_block_size = 1000
#: InitProducerId requests parked while a new producer-id block is being made durable.
producer_id_waiters_max = 1000
transaction_timeout_ms_default = 60_000
transaction_timeout_ms_max = 900_000  # Kafka's transaction.max.timeout.ms default
#: A transactional id idle (no open transaction) for this long is expired (tombstoned).
transactional_id_expiration_ms = 7 * 24 * 3600 * 1000
#: Transactional ids one coordinator keeps.
transactional_ids_max = 100_000
#: Open (begun, not completed) transactions per producer. KIP-98 allows one; the issue's
#: bound is 5, and one is within it (see docs/exactly-once.md).
transactions_open_per_producer_max = 1
#: Partitions, and committed consumer offsets, one transaction may hold.
partitions_per_transaction_max = 10_000
#: Producer-state snapshots kept per partition (the newest; older ones are deleted).
producer_snapshots_kept = 2
#: Markers of one transaction the broker retries writing after a storage error, at most this
#: often (and the delay between two attempts of one partition doubles up to this).
transaction_marker_retry_ms_max = 5_000

assert 1 <= producer_batches_retained <= 64
assert 1 <= transactions_open_per_producer_max <= 5
assert 0 < transaction_timeout_ms_default <= transaction_timeout_ms_max
assert partitions_per_transaction_max <= list_length_max
assert session_timeout_ms_min <= session_timeout_ms_default <= session_timeout_ms_max
assert rebalance_timeout_ms_default <= rebalance_timeout_ms_max
assert offset_metadata_bytes_max <= config_value_bytes_max  # the codec's string bound covers it
assert member_id_bytes_max <= config_value_bytes_max
assert group_members_max <= list_length_max

# --- clients -------------------------------------------------------------------------------
#: Async offset commits a consumer may have queued and not yet sent.
async_commits_pending_max = 1024
assert async_commits_pending_max > 0
