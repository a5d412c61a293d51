"""The produce lane: one task reads, appends and answers the small produce requests of every
idle connection, so a request costs no task wake-ups of its own.

Theory of operation
-------------------
A connection's reader and writer tasks (``connection.py``) cost two task switches and a
trip through trio's I/O layers per request; a client that sends one record and waits for its
answer pays them per record (``../shared/reference/perf.md`` §11 measured 20-45 µs of CPU per
request for them alone). The lane serves the same requests from one task, the way a reactor
does, through ``Env.net.readiness()`` (an epoll set over the sockets here, the simulated
streams' buffers in the simulator: the same lane runs in both).

A reader with nothing buffered hands its connection to the lane (``adopt``) and parks. Each
*pass* of the lane, after a partition progressed, first answers what that progress settled
(step 3, for every connection it answers), so that the next requests of the clients it
answered come in while it reads and join the group commit this pass feeds. (Answered last,
after the reads, they always missed it: sixteen one-request clients split into two groups
that took turns, 8.5 requests per fsync; answered first, with the polls of step 1, 15.8 of
16. docs/performance.md, "Answers first".) Then it:

1. takes the watched streams that are ready (``ready()``: no waiting), and for each reads
   what is there now into the connection's sans-I/O core (an end of stream or an error
   hands the connection back); then polls again, and reads again, while a poll finds more
   (the answered clients' next requests come in one by one as their load gets a core),
   at most ``_POLLS_PER_PASS_MAX`` polls (5) and ``frames_per_pass_max`` requests in all;
2. takes the complete requests in order: a Produce that expects an answer is begun
   (``_Connection.begin_produce``: validated and staged by ``DataPath.produce``, in request
   order, exactly as the reader would append it) and its answer left in its slot (``place``).
   A produce whose payload has the shape of one its client sent before (same topic,
   partition, acks, time-out and version; only the records differ) is taken without being
   decoded (``ServerConnection.next_plain_produce``, ``protocol/produce_shape.py``: the
   shape proves that such a payload decodes to that request with those records) and begun
   by ``DataPath.produce_plain``: one-record producers repeat one request, and decoding it
   was ~1.8 us of the ~30 each costs; while a topic is gated every request is decoded;
   anything else — another api, acks=0, a gated topic — and a partial frame or the in-flight
   limit hand the connection back to its reader, with what the lane took; then every partition
   writes what the pass staged with one ``pwritev`` (``AppendPass.close``,
   ``storage/staged_appends.py``), before anything is answered, and the group commit of those
   writes runs in the lane's own task when no group is running and the fsyncs run on the loop
   (``SyncWorker.write_then_commit``: the worker's task would block the loop just the same,
   after a hand-off that cost ~2 us per request at sixteen one-record producers); else the sync
   worker commits, as for any other append;
3. answers, for every connection the lane answers when the pass's commit (or any other
   progress) came, else for the connections that took requests in the pass (nothing else
   can have become ready without progress), every slot from the head that is ready
   (``take_ready_frames``: the produce's ``Pending.ready``, so the group commit or the high
   watermark decides, never the lane; without progress a ``Pending.after_progress`` is not
   asked; the commonest produce's ``OnePartitionWait`` gives its frame from the template),
   encoded in order and written with one non-blocking ``send_now``; what the socket does
   not take goes to the writer (``unsent``) with the connection's answering;
4. checkpoints once when it read anything or progress came meanwhile (the group commit's
   worker and every other task run), else sleeps in ``readiness.wait()`` until a stream is
   ready, a partition reports progress (``progressed``: a commit, a failure or a change of
   leader wakes the waits of the answers owed), or the earliest deadline of an answer owed
   passes (that connection goes back to its writer, whose ``Pending.wait`` answers the
   time-out). The lane keeps a time at or before every deadline of an answer it owes
   (``_expire_at``, lowered as it takes requests) and looks at the connections only when
   that time has come.

The lane answers a connection only while its writer is parked with nothing owed
(``writer_idle``) and takes over from the first slot it queues then (``lane_answering``);
otherwise the writer answers what the lane queued, in order, as it would the reader's. So one
of the two writes at a time and answers stay in request order.

Appends are staged in the lane, one request after another, and written per partition at the
end of the pass's reads; the group commit (``storage/sync_worker.py``) covers everything
appended before it ran, run by the lane itself while fsyncs are fast and by the sync worker
otherwise; when fsyncs are slow they run off the loop for the whole group
(``sync_thread.py``), never one request's, and the lane reads on meanwhile. Limits hold as
in the reader: the request budget and the request timeout apply to partial frames, which
only the reader reads; the in-flight limit hands back.

Test-only: ``answer_early`` (the simulator's ``[test] lane_answer_early``) makes the lane
answer a produce as soon as it is appended, with ``Pending.provisional``: the deliberate bug
that proves the checkers catch an answer before durability. With it on, the lane leaves the
group commit to the worker, so those answers go out before it. Off in production.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import trio

from rivven_broker.protocol.connection import BadRequest, RequestReceived
from rivven_broker.protocol.messages import ACKS_NONE, Produce
from rivven_broker.storage.staged_appends import AppendPass

if TYPE_CHECKING:
    from rivven_broker.server.connection import Begun, ReadAt, _Connection
    from rivven_broker.server.env import Readiness
    from rivven_broker.server.metrics import BrokerMetrics
    from rivven_broker.storage.sync_worker import SyncWorker

__all__ = ["ProduceLane", "LaneStatistics", "frames_per_pass_default"]

#: Requests a pass takes at most before it answers and checkpoints.
frames_per_pass_default = 1024
#: Readiness polls a pass makes at most while each finds more to read.
_POLLS_PER_PASS_MAX = 5
_RECEIVE_BYTES = 256 * 1024


@attrs.frozen
class LaneStatistics:
    passes: int
    requests: int
    handbacks: int
    connections: int


class ProduceLane:
    """One task serving the produce requests of idle connections. See the module docstring."""

    def __init__(self, readiness: Readiness, metrics: BrokerMetrics,
                 staging: AppendPass | None = None, *,
                 sync: SyncWorker | None = None,
                 frames_per_pass_max: int = frames_per_pass_default,
                 answer_early: bool = False) -> None:
        assert frames_per_pass_max > 0
        self._readiness = readiness
        self._staging = staging if staging is not None else AppendPass()
        # With the deliberate bug on, the worker commits: the answers go out before it.
        self._sync = sync if not answer_early else None
        self._metrics = metrics
        self._frames_per_pass_max = frames_per_pass_max
        self._answer_early = answer_early
        self._members: dict[trio.abc.Stream, _Connection] = {}
        self._answering: dict[_Connection, None] = {}  # insertion-ordered: deterministic
        self._took: dict[_Connection, None] = {}  # took requests in this pass
        #: At or before the deadline of every answer the lane owes (``_expire`` looks then).
        self._expire_at = math.inf
        self._wait_scope: trio.CancelScope | None = None
        self._progressed = False
        self._running = False
        self._passes = 0
        self._requests = 0
        self._handbacks = 0

    def statistics(self) -> LaneStatistics:
        """The lane's counters (``rivven_produce_lane_*`` in /metrics)."""
        return LaneStatistics(self._passes, self._requests, self._handbacks, len(self._members))

    # --- called by connections and partitions (never block) ---------------------------------

    def adopt(self, connection: _Connection) -> bool:
        """Watch ``connection``'s stream for its reader. False: the lane is not running, or
        this stream cannot be watched (the reader reads itself)."""
        assert not connection.in_lane
        if not self._running or not self._readiness.watch(connection.stream):
            return False
        self._members[connection.stream] = connection
        connection.in_lane = True
        connection.lane_returned = trio.Event()
        self._wake()  # its bytes may be there already; the lane's wait must include it
        return True

    def release(self, connection: _Connection) -> None:
        """Stop watching ``connection`` and give its answering back to its writer. Idempotent."""
        if connection.in_lane:
            connection.in_lane = False
            self._readiness.unwatch(connection.stream)
            del self._members[connection.stream]
        self._stop_answering(connection)

    def progressed(self, key: object = None) -> None:
        """A partition's waits must look again (``PartitionEvents.progressed``)."""
        if self._answering:
            self._wake()

    # --- the task ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve passes until cancelled; then every connection goes back to its reader."""
        readiness, staging = self._readiness, self._staging
        self._running = True
        task_status.started()
        try:
            while True:
                # Answers first: the next requests of the clients answered join this pass.
                progressed = self._answer_progress()
                streams = readiness.ready()
                if streams:
                    staging.open()
                    try:
                        self._read_pass(streams)
                    except BaseException:
                        staging.close()
                        raise
                    # Every append staged is written before any answer; then the group
                    # commit, in this task when the worker would only be a hand-off (step 2).
                    if self._sync is not None:
                        await self._sync.write_then_commit(staging.close)
                    else:
                        staging.close()
                    if not self._answer_progress():  # (the commit it just ran, if it did)
                        # Without progress only the connections that took requests can have
                        # an answer ready (a commit, a failure or a change of leader is).
                        self._answer(self._took, False)
                    self._took = {}
                if streams or progressed:
                    self._passes += 1
                deadline = self._expire_at  # no answer owed is due before it
                if deadline <= trio.current_time():  # a busy lane still times answers out
                    deadline = self._expire()
                if streams or self._progressed:  # (progress meanwhile: answer it first)
                    await trio.lowlevel.checkpoint()
                    continue
                with trio.CancelScope(deadline=deadline) as scope:
                    self._wait_scope = scope
                    try:
                        await readiness.wait()
                    finally:
                        self._wait_scope = None
        finally:
            self._running = False
            for connection in list(self._members.values()):
                self._hand_back(connection)
            for connection in list(self._answering):
                self._stop_answering(connection)
            readiness.close()

    def _wake(self) -> None:
        self._progressed = True
        scope = self._wait_scope
        if scope is not None:
            scope.cancel()

    def _answer_progress(self) -> bool:
        """If a partition progressed since the last look, step 3 for every connection the
        lane answers; whether one had."""
        if not self._progressed:
            return False
        self._progressed = False
        self._answer(self._answering, True)
        return True

    def _read_pass(self, streams: list[trio.abc.Stream]) -> None:
        """Steps 1 and 2 of a pass (module docstring): read ``streams``, then poll again
        while a poll finds more."""
        budget, polls = self._frames_per_pass_max, _POLLS_PER_PASS_MAX
        while True:
            budget = self._read(streams, budget)
            polls -= 1
            if budget <= 0 or not polls:
                return
            streams = self._readiness.ready()
            if not streams:
                return

    def _read(self, streams: list[trio.abc.Stream], budget: int) -> int:
        """Steps 1 and 2 for ``streams``, taking requests while ``budget`` lasts; what is
        left of it."""
        readiness, members = self._readiness, self._members
        now = trio.current_time()
        read_at: ReadAt | None = None  # the clocks, read once per poll
        received = 0  # (counted once per poll)
        for stream in streams:
            connection = members.get(stream)
            if connection is None:
                continue
            try:
                data = readiness.receive_now(stream, _RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._hand_back(connection, end="broken")
                continue
            if data is None:
                continue
            if not data:
                self._hand_back(connection, end="eof")
                continue
            connection.last_active = now
            received += len(data)
            connection.core.receive_data(data)
            if read_at is None:  # (every connection has its broker's clock)
                clock = connection.clock
                read_at = (now, clock.monotonic_ms(), clock.wall_ms())
            taken = self._take_requests(connection, read_at)
            if taken:
                self._took[connection] = None
            self._requests += taken
            budget -= taken
            if budget <= 0:
                break  # the rest stay ready (level-triggered) for the next pass
        if received:
            self._metrics.bytes_in(received)
        return budget

    def _take_requests(self, connection: _Connection, read_at: ReadAt) -> int:
        """Begin the connection's complete produce requests in order; hand it back at the
        first thing the lane does not take. ``read_at``: when this poll read (the clocks,
        read once per poll). Returns how many requests it took."""
        core = connection.core
        in_flight_max = connection.settings.in_flight_requests_max
        taken = 0
        while connection.in_lane:
            if len(connection.slots) >= in_flight_max:
                self._hand_back(connection)  # its reader waits for room
                break
            # A produce of the shape this client's produces had is taken undecoded
            # (``protocol/produce_shape.py``); while a topic is gated, every request is read
            # whole, so that its gate is asked.
            handlers = connection.handlers
            plain = core.next_plain_produce() if not handlers.gates_closed else None
            if plain is None:
                event = core.next_event()
                if event is None:
                    if core.buffered_bytes:
                        self._hand_back(connection)  # a partial frame: the reader's clocks
                    break
                request = event.request if type(event) is RequestReceived else None
                if type(request) is not Produce or request.acks == ACKS_NONE \
                        or handlers.gate(request) is not None:
                    self._hand_back(connection, event=event)
                    break
                correlation_id, records = event.correlation_id, None
            else:
                correlation_id, request, records = plain
            taken += 1
            if not connection.lane_answering and connection.writer_idle \
                    and not connection.slots and not connection.unsent:
                connection.lane_answering = True
                self._answering[connection] = None
            begun = connection.begin_produce(correlation_id, request, read_at, records)
            if not connection.place(begun):
                self._hand_back(connection, begun=begun)
                break
            slot = begun[0]
            pending = slot.pending
            if pending is not None and pending.deadline < self._expire_at \
                    and connection.lane_answering:
                self._expire_at = pending.deadline
            if self._answer_early and connection.lane_answering and pending is not None \
                    and pending.provisional is not None:  # the deliberate bug (docstring)
                slot.pending = None
                slot.response = pending.provisional()
                slot.filled = True
            if not core.buffered_bytes and len(connection.slots) < in_flight_max:
                break  # (the next round would only find that out)
        return taken

    def _answer(self, connections: dict[_Connection, None], progressed: bool) -> None:
        """Step 3 of a pass (module docstring), for ``connections``; ``progressed``: a
        partition progressed since the last pass (every connection answering is asked then,
        so without it a pending that waits for progress has nothing new to say)."""
        if not connections:
            return
        readiness = self._readiness
        now, now_ms = trio.current_time(), None  # (every connection has its broker's clock)
        sent_total = 0  # (counted once per call)
        for connection in list(connections):
            if not connection.lane_answering:
                continue
            if now_ms is None:
                now_ms = connection.clock.monotonic_ms()
            frames = connection.take_ready_frames(now_ms, progressed)
            if not frames:
                continue
            slots = connection.slots
            data = frames[0] if len(frames) == 1 else b"".join(frames)  # type: ignore[arg-type]
            assert type(data) is bytes  # produce answers never carry file regions
            try:
                sent = readiness.send_now(connection.stream, data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._hand_back(connection, end="broken")
                continue
            sent_total += sent
            if sent < len(data):  # a slow reader: its writer sends the rest, and answers on
                connection.unsent = data[sent:]
                self._stop_answering(connection)
                continue
            if not slots:
                connection.last_active = now
                self._stop_answering(connection)
        if sent_total:
            self._metrics.bytes_out(sent_total)

    def _expire(self) -> float:
        """Give every connection whose oldest answer owed reached its deadline back to its
        writer (its ``Pending.wait`` answers the time-out); the earliest deadline of the
        answers still owed (every slot's, not only the heads': the next look is then)."""
        now = trio.current_time()
        next_deadline = math.inf
        for connection in list(self._answering):
            slots = connection.slots
            head = slots[0].pending if slots else None
            if head is not None and head.deadline <= now:
                self._stop_answering(connection)
                continue
            for slot in slots:
                pending = slot.pending
                if pending is not None and pending.deadline < next_deadline:
                    next_deadline = pending.deadline
        self._expire_at = next_deadline
        return next_deadline

    def _stop_answering(self, connection: _Connection) -> None:
        if connection.lane_answering:
            connection.lane_answering = False
            del self._answering[connection]
            if connection.slots or connection.unsent:
                connection.wake_writer()

    def _hand_back(self, connection: _Connection, *,
                   event: RequestReceived | BadRequest | None = None,
                   begun: Begun | None = None, end: str | None = None) -> None:
        connection.lane_event = event
        connection.lane_begun = begun
        connection.lane_end = end
        self._handbacks += 1
        self.release(connection)
        connection.lane_returned.set()
