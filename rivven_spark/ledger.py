"""The sink's ledger: which micro-batch each writer task of a query last committed.

Theory of operation
-------------------
Spark may run a micro-batch's write again: a task retried after it had already written (it
failed while reporting back), or a whole batch replayed after a restart because the driver
died between the tasks' writes and Spark's own commit log. The replay has the same batch id,
the same input rows (the source's offsets are fixed in the offset log) and the same task
partitioning. To make the replay write nothing, every writer task, once its rows are sent,
appends one *marker* record to the query's ledger topic: key ``"<task>"``, value JSON
``{"queryId", "batchId", "task", "rows"}``. Before writing, a task looks for its own marker;
if it finds one for this batch id or a later one, it writes nothing.

With a transactional producer (transactional id ``rivven-spark.<queryId>.<task>``, stable
across attempts) the rows and the marker are one transaction: both become visible to
``read_committed`` readers or neither does, and ``init_transactions`` fences and aborts any
earlier attempt of the same task before the lookup. Without transactions the marker follows a
flush of the rows, so a task that dies between the two is written again (at-least-once in that
window only). docs/spark.md states the guarantee.

Lookup: the ledger topic has one partition and belongs to one query. Markers are appended in
batch order: all of batch N's markers come after every marker of batch N-1 (Spark starts a
batch only when the previous one completed). So a task asking about batch N reads the ledger
backwards from its end (``read_committed``) in growing windows and stops at its own marker
(found) or at any marker of an earlier batch (not found). That reads about one batch's worth
of markers, however long the query has run.

Blocks on the network (the topic is created on first use).
"""

from __future__ import annotations

import json
from typing import NamedTuple

from rivven_broker.client import Admin, TopicAlreadyExistsError

from rivven_spark.broker_io import BrokerIO
from rivven_spark.options import Subscription

__all__ = ["TaskIdentity", "ledger_topic_for", "Ledger", "WINDOW_RECORDS_FIRST"]

#: Markers read in the first backwards window; each further window is four times larger.
WINDOW_RECORDS_FIRST = 256
_REPLICAS_MAX = 3


class TaskIdentity(NamedTuple):
    """Who is writing: the streaming query, its micro-batch and the task's partition."""

    query_id: str
    batch_id: int
    task: int

    @property
    def transactional_id(self) -> str:
        return f"rivven-spark.{self.query_id}.{self.task}"


def ledger_topic_for(query_id: str, override: str | None = None) -> str:
    """The ledger topic of a query: ``__rivven_spark_sink.<queryId>`` unless overridden."""
    return override or f"__rivven_spark_sink.{query_id}"


class Ledger:
    """Reads and prepares the markers of one query's ledger topic (see module docstring)."""

    def __init__(self, io: BrokerIO, bootstrap: str, topic: str) -> None:
        self._io = io
        self._bootstrap = bootstrap
        self.topic = topic

    def ensure_topic(self) -> None:
        """Create the ledger topic (one partition) unless it exists. Blocks."""
        if self._exists():
            return
        with Admin(self._bootstrap) as admin:
            brokers = len(admin.cluster_status().brokers)
            try:
                admin.create_topic(self.topic, partitions=1,
                                   replication_factor=max(1, min(_REPLICAS_MAX, brokers)))
            except TopicAlreadyExistsError:
                pass  # another task won the race

    def _exists(self) -> bool:
        found = self._io.snapshot(Subscription(assign=((self.topic, 0),)), "read_committed",
                                  earliest=False)
        return bool(found)

    def committed(self, identity: TaskIdentity) -> int | None:
        """The newest batch id this task committed, if it is >= ``identity.batch_id``;
        None otherwise (including: no marker at all). Blocks."""
        snap = self._io.offsets_of(self.topic, 0, "read_committed")
        high = snap.latest
        window = WINDOW_RECORDS_FIRST
        while high > snap.earliest:
            low = max(snap.earliest, high - window)
            records = self._io.read_records(self.topic, 0, low, high, "read_committed")
            for record in reversed(records):
                marker = json.loads(record.value)
                if marker["task"] == identity.task:
                    batch = int(marker["batchId"])
                    return batch if batch >= identity.batch_id else None
                if int(marker["batchId"]) < identity.batch_id:
                    return None
            high = low
            window *= 4
        return None

    @staticmethod
    def marker(identity: TaskIdentity, rows: int) -> tuple[bytes, bytes]:
        """The ``(key, value)`` of this task's marker record."""
        value = {"queryId": identity.query_id, "batchId": identity.batch_id,
                 "task": identity.task, "rows": rows}
        return str(identity.task).encode(), json.dumps(value, sort_keys=True).encode()
