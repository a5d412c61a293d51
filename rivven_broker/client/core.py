"""The client core: everything a driver needs that is pure (no sockets, threads or clocks).

Theory of operation
-------------------
As in h11, the client's decisions live in plain synchronous objects that take ``now_ms`` and an
injected ``random.Random`` and return what to do; the blocking driver (threads and sockets),
the trio driver and the simulator all drive the same objects:

- ``metadata``: bootstrap parsing and the metadata cache (topics -> partitions -> leaders);
- ``retry``: exponential backoff with jitter, bounded by attempts and a deadline, and which
  errors call for a metadata refresh;
- ``accumulator``: per-partition batches, linger and batch size, murmur2 / sticky partitioning,
  the buffer bound, draining ready batches into per-broker Produce plans;
- ``producer_core``: the sender's decisions (expiry, retries, outcomes);
- ``transaction_manager``: producer id, sequences and transactions of an exactly-once producer;
- ``fetch_state``: the consumer's assignment, positions, prefetch buffer and resets, and
  ``read_committed`` filtering (``aborted_batch_filter``);
- ``consumer_core``: the fetch side's decisions (``FetcherCore.step``: which resets and
  Fetches to send to which leader, which leaders to dial, when metadata is due, when to wake);
- ``call_retry``: one request/response call with retries (``CallRetry``: unknown node, dial
  failures, backoff, deadline), for ``SyncClient.call`` and ``TrioCluster.call``;
- ``reconnect``: when each broker address may be dialled again (``ReconnectBackoff``);
- ``group_core`` and ``membership``: group membership, and around it the coordinator lookup,
  commit retry, heartbeat schedule, auto-commit and metadata re-check timers and the bounded
  ``commit_async`` queue;
- ``requests``: building requests and reading answers into results or typed errors.

``tests/test_tidy.py`` holds every module of the package except the drivers (the files named
``_*.py`` and the front modules that gather them) to this: no trio, threads, sockets,
selectors or clock, and no driver imports.

This module re-exports them as one namespace.
"""

from __future__ import annotations

from rivven_broker.client.accumulator import (
    DrainResult,
    ProducePlan,
    ProducerBatch,
    RecordAccumulator,
)
from rivven_broker.client.call_retry import CallRetry
from rivven_broker.client.config import ConnectionConfig, ConsumerConfig, ProducerConfig
from rivven_broker.client.consumer_core import FetcherCore, FetchStep
from rivven_broker.client.fetch_state import (
    EARLIEST,
    LATEST,
    CompletedFetch,
    FetchPlan,
    FetchState,
    aborted_batch_filter,
    decode_completed,
)
from rivven_broker.client.group_core import GroupCore
from rivven_broker.client.membership import (
    AsyncCommits,
    CommitRetry,
    CoordinatorLookup,
    GroupTimers,
    HeartbeatSchedule,
    HeartbeatStep,
)
from rivven_broker.client.metadata import Address, MetadataCache, parse_bootstrap
from rivven_broker.client.producer_core import BatchOutcome, ProducerCore, SenderStep
from rivven_broker.client.reconnect import ReconnectBackoff
from rivven_broker.client.retry import RetryDecision, RetryPolicy, needs_metadata_refresh
from rivven_broker.client.transaction_manager import (
    CoordinatorCall,
    TransactionManager,
    TxnPhase,
    TxnResult,
)

__all__ = [
    "Address",
    "MetadataCache",
    "parse_bootstrap",
    "RetryPolicy",
    "RetryDecision",
    "needs_metadata_refresh",
    "RecordAccumulator",
    "ProducerBatch",
    "ProducePlan",
    "DrainResult",
    "ProducerCore",
    "SenderStep",
    "BatchOutcome",
    "FetchState",
    "FetchPlan",
    "CompletedFetch",
    "decode_completed",
    "aborted_batch_filter",
    "TransactionManager",
    "TxnPhase",
    "TxnResult",
    "CoordinatorCall",
    "EARLIEST",
    "LATEST",
    "ConnectionConfig",
    "ProducerConfig",
    "ConsumerConfig",
    "FetcherCore",
    "FetchStep",
    "CallRetry",
    "ReconnectBackoff",
    "GroupCore",
    "CoordinatorLookup",
    "CommitRetry",
    "HeartbeatSchedule",
    "HeartbeatStep",
    "GroupTimers",
    "AsyncCommits",
]
