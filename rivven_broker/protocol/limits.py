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
idle_timeout_ms = 120_000  # a half-sent frame or a silent client is closed after this
handshake_timeout_ms = 10_000

# --- storage -------------------------------------------------------------------------------
index_interval_bytes = 4096
segment_bytes_default = 1024 * 1024 * 1024
segment_bytes_min = 1024
segment_ms_default = 7 * 24 * 3600 * 1000
retention_ms_default = 7 * 24 * 3600 * 1000
sync_group_bytes_max = 4 * 1024 * 1024  # one group commit covers at most this much new data

assert frame_header_bytes == 4 + 1 + 4
assert batch_bytes_max < frame_bytes_max
assert fetch_partition_bytes_max <= fetch_bytes_max
assert fetch_bytes_max < response_bytes_max
assert max_message_bytes_default <= batch_bytes_max
assert in_flight_requests_per_connection_max > 0
assert topic_name_bytes_max <= wire_name_bytes_max
assert group_id_bytes_max <= wire_name_bytes_max
assert config_value_bytes_max <= frame_bytes_max
assert index_interval_bytes > 0
assert segment_bytes_min <= segment_bytes_default
