"""The trio driver of one client connection: read, dispatch, answer in order, coalesce writes.

Theory of operation
-------------------
All protocol state lives in the sans-I/O ``ServerConnection``; this driver owns the socket,
the tasks and the timers. Two loops share one ``_Connection``:

- The *reader* receives bytes, feeds them to the core and takes events. For each request it
  calls ``Handlers.begin`` at once, in request order (so appends land in order), and puts a
  *slot* at the tail of the answer queue. A ready answer fills its slot now; a *serial*
  pending is awaited by the reader before it goes on; a pending that can say it is done
  without waiting (``Pending.ready``: produces, which wait only for durability, each within a
  deadline fixed when it arrived) stays in its slot for the writer; any other ``Pending``
  (a long-polling fetch, a group join) runs as its own task and fills its slot when done.
  acks=0 produces get no slot. When ``in_flight_requests_max`` slots are open the reader stops
  reading: TCP backpressure reaches the client.
- The *writer* waits until the head slot is filled, then takes every filled slot from the head,
  encodes them in order and writes them with ONE ``send_all``: answers that become ready
  together leave together. A head slot still holding a produce is settled by the writer
  itself: it asks ``ready()``, else awaits the wait, and then asks ``ready()`` of the produces
  behind it, so one group commit answers a whole pipelined run with one wake-up and one
  write, and no task is started per request.

Bad input: an undecodable payload, an unknown api or version, or a non-msgpack format is
answered with an ``ErrorResponse`` in the request's correlation id and the connection goes on;
a frame over the size limit (framing lost) is answered in correlation id 0 after the answers
already queued, and the connection closes.

Timeouts: one watchdog task per connection enforces two.

- *Idle*: a connection is idle when the reader is waiting for bytes, no answer is owed, and
  nothing arrived or left for ``idle_timeout_ms``. A client that sends nothing is closed then;
  a client waiting for a long-poll is not idle.
- *Request*: a frame must be complete within ``request_timeout_ms`` of its first byte (Kafka
  has no such bound; a frame trickled a byte a second would otherwise hold the connection and
  its buffer forever, since every byte resets the idle clock). Time the reader spends not
  reading (in-flight limit reached, request budget spent) does not count against the client.

The reader and writer only note times (floats, no timer per request): ``last_active`` on
every receive and answer, ``frame_began`` when a receive leaves part of a frame behind. The
watchdog sleeps until the earlier deadline (woken when ``frame_began`` is first set), looks
again if there was activity meanwhile, and otherwise cancels the reader's scope. The scope is
cancelled only while the reader waits in ``receive_some``, and the reader re-checks it after
every receive, so a cancel never lands in the middle of handling a request. Durations use
trio's clock (the virtual clock under the simulator); request latencies use ``env.clock``.

Request budget: a frame that does not arrive whole in one receive reserves its full size from
the broker-wide ``RequestBudget`` before the reader reads on, and releases it once complete;
while the budget is spent the reader waits and reads nothing (``request_budget.py``).

Shutdown: ``stop_reading()`` makes the reader stop (dropping bytes not yet read as requests);
answers already owed are still written, then the connection closes.

The produce lane
----------------
With a ``ProduceLane`` (``produce_lane.py``), a reader with nothing buffered whose last request
was a produce (``produces``; a consumer's connection stays out: its fetches would only be
handed back, each costing a wake-up and an epoll registration) does not wait for bytes itself:
it hands its stream to the lane (``adopt``) and parks. The lane reads every ready connection in
one task, takes the Produce requests it can (``begin_produce``, the reader's ``begin`` for a
produce, and ``place``, as the reader does), and, when the writer is parked with nothing owed
(``writer_idle``), answers them itself (``lane_answering``): the reader and writer tasks of a
connection that only produces never wake. Anything else — another api, acks=0, a gated topic, a
partial frame, the in-flight limit, the end of the stream — and the lane hands the connection
back (``lane_event``/``lane_begun``/``lane_end`` say what it took) and sets ``lane_returned``:
the reader goes on from there, the writer takes over owed answers (and ``unsent``, the rest of
an answer the socket did not take at once). Answers stay in request order: there is one queue
of slots, and one of the two (lane or writer) writes at a time. The parked reader counts as
receiving for the idle timeout and for ``stop_reading``; leaving the lane in any way (cancelled
included) releases the stream from it first.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import TYPE_CHECKING, Callable, TypeVar

import attrs
import trio

from rivven_broker.file_region import FileRegion
from rivven_broker.protocol import codec, limits
from rivven_broker.protocol.connection import (
    CONNECTION_ERROR_CORRELATION_ID,
    BadRequest,
    RequestReceived,
    ServerConnection,
)
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError
from rivven_broker.protocol.framing import (
    FORMAT_MSGPACK,
    REFERENCE_BYTES_MIN,
    FramePieces,
    encode_frame,
)
from rivven_broker.protocol.message_base import Request, Response
from rivven_broker.protocol.messages import (
    ACKS_NONE,
    DeleteRecordsResponse,
    ErrorResponse,
    FetchResponse,
    Handshake,
    ListOffsetsResponse,
    MetadataResponse,
    Produce,
    ProduceResponse,
)
from rivven_broker.server.context import Pending, RequestContext
from rivven_broker.server.produce_answers import OnePartitionWait
from rivven_broker.server.request_budget import RequestBudget
from rivven_broker.storage.errors import SyncFailedError

if TYPE_CHECKING:
    from rivven_broker.protocol.produce_shape import ProduceShape
    from rivven_broker.server.env import Clock
    from rivven_broker.server.handlers import Handlers
    from rivven_broker.server.metrics import BrokerMetrics
    from rivven_broker.server.produce_lane import ProduceLane

#: A request begun (its slot queued) and what ``Handlers.begin`` gave for it.
Begun = tuple["_Slot", "Response | Pending | OnePartitionWait"]
#: What a first half returns when the answer must wait: the general ``Pending``, or the
#: commonest produce's ``OnePartitionWait`` (the same fields).
_WAITS = (Pending, OnePartitionWait)
#: When requests were read: trio's clock, ``Clock.monotonic_ms()`` and ``Clock.wall_ms()``.
ReadAt = tuple[float, int, int]

__all__ = ["ConnectionSettings", "serve_client_connection", "ClientConnections"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_RECEIVE_BYTES = 256 * 1024
_PARTITIONED_RESPONSES = (
    ProduceResponse, FetchResponse, ListOffsetsResponse, DeleteRecordsResponse
)
_INTERNAL_ERROR = "internal error; see the broker log"


@attrs.frozen
class ConnectionSettings:
    idle_timeout_ms: int
    in_flight_requests_max: int
    request_timeout_ms: int = limits.request_timeout_ms_default


@attrs.define(slots=True)
class _Slot:
    correlation_id: int
    api: str
    start_ms: int
    response: Response | None = None
    filled: bool = False  # ``response`` is final: the slot may be answered
    pending: Pending | OnePartitionWait | None = None  # a produce the writer settles


class _Connection:
    """The shared state of one connection's reader and writer."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        handlers: Handlers,
        settings: ConnectionSettings,
        clock: Clock,
        metrics: BrokerMetrics,
        budget: RequestBudget,
        lane: ProduceLane | None = None,
    ) -> None:
        self.stream = stream
        self.handlers = handlers
        #: Who is on the other end: the client id its Handshake gave, and its host.
        self.client_id = ""
        self.client_host = ""
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.core = ServerConnection(reference_bytes_min=REFERENCE_BYTES_MIN)
        self.slots: deque[_Slot] = deque()
        self.writer_wakeup = trio.Event()  # a slot filled, or reading ended
        self.reader_wakeup = trio.Event()  # answers went out (room), or stop_reading
        self.reading = True
        self.stopping = False
        self.fatal: bytes | None = None  # the closing error frame, after a fatal BadRequest
        self.read_scope = trio.CancelScope()  # cancelled (only while receiving) to stop
        self.receiving = False  # the reader is waiting in receive_some
        self.waiting_budget = False  # the reader is waiting for the request budget
        self.closed_by: str | None = None  # "idle" or "request_timeout": the watchdog closed
        self.last_active = trio.current_time()  # bytes in, or the last answer out
        self.frame_began: float | None = None  # a frame is partly received since then
        self.watch_wakeup = trio.Event()  # frame_began was set
        self.budget = budget
        self.reserved_bytes = 0  # this connection's reservation for its partial frame
        # The produce lane (see "The produce lane" in the module docstring).
        self.lane = lane
        self.produces = False  # the last request the reader handled was a produce (acks 1|all)
        self.in_lane = False  # the lane watches the stream; the reader is parked
        self.lane_answering = False  # the lane writes the answers; the writer stays parked
        self.lane_returned = trio.Event()
        self.lane_event: RequestReceived | BadRequest | None = None  # taken, left to the reader
        self.lane_begun: Begun | None = None  # begun by the lane, to finish in this task
        self.lane_end: str | None = None  # "eof" or "broken": the lane saw the stream end
        self.writer_idle = False  # the writer is parked with no answer owed
        self.unsent = b""  # the rest of an answer the lane wrote in part

    # --- shared helpers ----------------------------------------------------------------------

    def wake_writer(self) -> None:
        self.writer_wakeup.set()

    def wake_reader(self) -> None:
        self.reader_wakeup.set()

    def fill(self, slot: _Slot, response: Response) -> None:
        slot.response = response
        slot.filled = True
        self.wake_writer()

    def stop_reading(self) -> None:
        """Stop taking requests; answers already owed are still sent. Never blocks."""
        self.stopping = True
        if self.lane is not None:
            self.lane.release(self)
        if self.receiving or self.waiting_budget:
            self.read_scope.cancel()
        self.wake_reader()
        self.wake_writer()

    async def watch(self) -> None:
        """Close the reader once the connection has been idle for the idle timeout, or a frame
        has been incomplete for the request timeout (see the module docstring). Returns then."""
        idle_s = self.settings.idle_timeout_ms / 1000
        request_s = self.settings.request_timeout_ms / 1000
        while True:
            now = trio.current_time()
            began = self.frame_began
            request_at = math.inf if began is None else began + request_s
            if now >= request_at and self.receiving:
                self.closed_by = "request_timeout"
                self.read_scope.cancel()
                return
            idle_at = self.last_active + idle_s
            if now >= idle_at:
                if not self.slots and self.receiving:
                    self.closed_by = "idle"
                    self.read_scope.cancel()
                    return
                idle_at = now + idle_s  # an answer owed or a request in hand: look again
            if request_at <= now:  # not reading now: the reader moves frame_began on
                request_at = now + request_s
            if self.watch_wakeup.is_set():
                self.watch_wakeup = trio.Event()
            with trio.move_on_at(min(idle_at, request_at)):
                await self.watch_wakeup.wait()

    def _pause_frame_clock(self, since: float) -> None:
        """The reader did not read from ``since`` until now: that time is not the client's."""
        if self.frame_began is not None:
            self.frame_began += trio.current_time() - since

    # --- the reader --------------------------------------------------------------------------

    async def read_loop(self, nursery: trio.Nursery) -> str:
        """Take requests until EOF, idle timeout, a fatal error or ``stop_reading``.

        Returns why it stopped: ``eof``, ``idle``, ``fatal`` or ``stopped``.
        """
        with self.read_scope:
            reason = await self._read_requests(nursery)
        if self.read_scope.cancel_called:
            return self.closed_by or "stopped"
        return reason

    async def _read_requests(self, nursery: trio.Nursery) -> str:
        core = self.core
        in_flight_max = self.settings.in_flight_requests_max
        while not self.stopping:
            if len(self.slots) >= in_flight_max:
                paused_at = trio.current_time()
                while len(self.slots) >= in_flight_max and not self.stopping:
                    self.reader_wakeup = trio.Event()
                    await self.reader_wakeup.wait()  # backpressure: until answers go out
                self._pause_frame_clock(paused_at)
            if self.stopping:
                break
            event = core.next_event()
            if event is None:
                if core.buffered_bytes:
                    await self._partial_frame()
                    outcome = await self._receive()
                else:
                    self.frame_began = None
                    outcome = await self._rest_in_lane(nursery)
                if outcome is not None:
                    return outcome
                continue
            if self.frame_began is not None:  # a frame is complete; its reservation ends
                self.frame_began = None
                self.release_budget()
            if isinstance(event, RequestReceived):
                await self._handle(event.correlation_id, event.request, nursery)
            else:
                self._bad_request(event)
                if event.fatal:
                    return "fatal"
        return "stopped"

    async def _rest_in_lane(self, nursery: trio.Nursery) -> str | None:
        """Wait for bytes in the produce lane (or, without one, here); then go on with what
        the lane handed back. Returns why reading ends, or None."""
        lane = self.lane
        if lane is None or not self.produces or not lane.adopt(self):
            return await self._receive()
        self.receiving = True
        try:
            await self.lane_returned.wait()
        finally:
            self.receiving = False
            lane.release(self)  # cancelled (idle, stop): the lane lets go first
        end, self.lane_end = self.lane_end, None
        if end == "broken":
            raise trio.BrokenResourceError("the lane found the connection broken")
        if end is not None:
            return end
        begun, self.lane_begun = self.lane_begun, None
        if begun is not None:
            await self._dispose(begun, nursery)
        event, self.lane_event = self.lane_event, None
        if isinstance(event, RequestReceived):
            await self._handle(event.correlation_id, event.request, nursery)
        elif event is not None:
            self._bad_request(event)
            if event.fatal:
                return "fatal"
        return None

    async def _partial_frame(self) -> None:
        """Before reading the rest of a frame: start its request clock, and reserve its size
        from the budget once its header is in (waiting while the budget is spent)."""
        if self.frame_began is None:
            self.frame_began = self.last_active  # its first byte came with the last receive
            self.watch_wakeup.set()
        frame_bytes = self.core.partial_frame_bytes
        if not frame_bytes or self.reserved_bytes:
            return
        if not self.budget.try_reserve(frame_bytes):
            self.metrics.request_budget_waited()
            waited_from = trio.current_time()
            self.waiting_budget = True
            try:
                await self.budget.reserve(frame_bytes)
            finally:
                self.waiting_budget = False
            self._pause_frame_clock(waited_from)
        self.reserved_bytes = frame_bytes

    def release_budget(self) -> None:
        if self.reserved_bytes:
            self.budget.release(self.reserved_bytes)
            self.reserved_bytes = 0

    async def _receive(self) -> str | None:
        """Wait for bytes and feed them to the core: None when it took some; ``"eof"`` at the
        end of the stream; ``"cancelled"`` when ``read_scope`` was cancelled as the bytes
        came in (they are dropped, and ``read_loop`` reports ``closed_by`` or ``"stopped"``
        instead: it never returns ``"cancelled"``)."""
        self.receiving = True
        try:
            data = await self.stream.receive_some(_RECEIVE_BYTES)
        finally:
            self.receiving = False
        if self.read_scope.cancel_called:  # cancelled as the bytes came in: drop them
            return "cancelled"
        self.last_active = trio.current_time()
        if not data:
            return "eof"
        self.metrics.bytes_in(len(data))
        self.core.receive_data(data)
        return None

    async def _handle(self, correlation_id: int, request: Request, nursery: trio.Nursery) -> None:
        # A connection rests in the lane only after a produce it could have taken: a
        # consumer's fetches would each cost a hand-back and an epoll registration there.
        self.produces = type(request) is Produce and request.acks != ACKS_NONE
        gate = self.handlers.gate(request)
        while gate is not None:
            await gate.wait()
            gate = self.handlers.gate(request)
        begun = self.begin(correlation_id, request)
        if begun is not None:
            await self._dispose(begun, nursery)

    def begin(self, correlation_id: int, request: Request,
              read_at: ReadAt | None = None) -> Begun | None:
        """Run the request's first half and queue its slot (None: it gets no answer).
        Never blocks; the reader and the lane call it in request order. ``read_at``: when
        the request was read (the lane reads the clocks once per pass), else read now."""
        if isinstance(request, Handshake):  # who the client is, for group membership
            self.client_id = request.client_id
        clock = self.clock
        if read_at is None:
            start_ms, wall_ms, received_at = clock.monotonic_ms(), clock.wall_ms(), None
        else:
            received_at, start_ms, wall_ms = read_at
        api = type(request).__name__
        call = RequestContext(wall_ms, self.client_id, self.client_host, received_at)
        try:  # ``_guarded``, inline: this is every request's path
            outcome = self.handlers.begin(request, call)
        except (SyncFailedError, AssertionError):
            raise
        except Exception:
            outcome = _handler_failed(api)
        if outcome is None or not request.expects_response():  # acks=0: no answer
            self.metrics.request_done(api, 0, clock.monotonic_ms() - start_ms)
            return None
        slot = _Slot(correlation_id, api, start_ms)
        self.slots.append(slot)
        return slot, outcome

    def begin_produce(self, correlation_id: int, request: Produce | ProduceShape,
                      read_at: ReadAt, records: bytes | None = None) -> Begun:
        """``begin`` of a produce that expects an answer (acks 1 or all), read by the lane at
        ``read_at``: straight to ``DataPath.produce``, where ``Handlers.begin`` sends every
        produce, without the ``RequestContext`` it takes there. With ``records``,
        ``request`` is the shape of a produce the lane took undecoded
        (``ServerConnection.next_plain_produce``), carrying them: ``DataPath.produce_plain``.
        Never blocks."""
        received_at, start_ms, wall_ms = read_at
        data = self.handlers.data
        try:  # ``_guarded``, inline
            if records is None:
                outcome = data.produce(
                    request, wall_ms, received_at=received_at)  # type: ignore[arg-type]
            else:
                outcome = data.produce_plain(
                    request, records, wall_ms, received_at)  # type: ignore[arg-type]
        except (SyncFailedError, AssertionError):
            raise
        except Exception:
            outcome = _handler_failed("Produce")
        assert outcome is not None, "a produce with acks 1 or all is always answered"
        slot = _Slot(correlation_id, "Produce", start_ms)
        self.slots.append(slot)
        return slot, outcome

    def place(self, begun: Begun) -> bool:
        """Fill the slot, or leave its produce for whoever writes (the writer, or the lane
        when it answers). False: the outcome needs a task (``_dispose``). Never blocks."""
        slot, outcome = begun
        if isinstance(outcome, _WAITS):
            if outcome.serial or outcome.ready is None:
                return False
            slot.pending = outcome  # settled in order by the writer or the lane
        else:
            slot.response = outcome
            slot.filled = True
        if not self.lane_answering:
            self.wake_writer()
        return True

    async def _dispose(self, begun: Begun, nursery: trio.Nursery) -> None:
        if self.place(begun):
            return
        slot, pending = begun
        assert isinstance(pending, _WAITS)
        if pending.serial:
            await self._complete(slot, pending)
        else:
            nursery.start_soon(self._complete, slot, pending)

    async def _complete(self, slot: _Slot, pending: Pending | OnePartitionWait) -> None:
        self.fill(slot, await self._wait(slot, pending))

    async def _wait(self, slot: _Slot, pending: Pending | OnePartitionWait) -> Response:
        try:
            return await pending.wait()
        except (SyncFailedError, AssertionError):
            raise
        except Exception:  # a bug in one handler must not take the broker down: log, answer
            log.exception("the %s handler failed", slot.api)
            return ErrorResponse(ErrorCode.UNKNOWN_SERVER_ERROR, _INTERNAL_ERROR)

    def _bad_request(self, event: BadRequest) -> None:
        response = ErrorResponse(event.error_code, event.message)
        if event.fatal:
            # Encoded outside the core: correlation id 0 answers no request, whatever the
            # client numbered its requests, and the connection closes after it.
            assert event.correlation_id == CONNECTION_ERROR_CORRELATION_ID
            payload = codec.encode_response(response)
            self.fatal = encode_frame(FORMAT_MSGPACK, CONNECTION_ERROR_CORRELATION_ID, payload)
            self.metrics.request_done("Invalid", int(event.error_code), 0)
            self.wake_writer()
            return
        slot = _Slot(event.correlation_id, "Invalid", self.clock.monotonic_ms())
        self.slots.append(slot)
        self.fill(slot, response)

    # --- the writer --------------------------------------------------------------------------

    async def write_loop(self) -> None:
        """Send answers in request order, every ready run of them in one ``send_all``."""
        slots = self.slots
        while True:
            if self.unsent:  # the rest of an answer the lane began to write
                unsent, self.unsent = self.unsent, b""
                await self._send_bytes(unsent)
            if self.lane_answering:  # the lane writes; the writer waits until handed back
                await self._park_writer()
                continue
            if slots and slots[0].pending is not None and self.fatal is None:
                await self._settle_head()
            if not (slots and slots[0].filled):
                if self.fatal is not None:
                    await self._send([self.fatal])
                    return
                if not self.reading and not slots:
                    return
                await self._park_writer()
                continue
            await self._send(self.take_ready_frames())
            if not slots:
                self.last_active = trio.current_time()
            self.wake_reader()  # room for the reader

    async def _park_writer(self) -> None:
        self.writer_wakeup = trio.Event()
        self.writer_idle = not self.slots or self.lane_answering
        try:
            await self.writer_wakeup.wait()
        finally:
            self.writer_idle = False

    def take_ready_frames(self, now_ms: int | None = None,
                          progressed: bool = True) -> FramePieces:
        """Settle, encode and dequeue every ready answer from the head, in order (the
        writer's and the lane's one way to answer): filled slots, and produces durable now
        (their ``ready``; a ``OnePartitionWait``'s frame straight from its template, with no
        answer built). ``now_ms``: the clock's ``monotonic_ms()`` (read here when not given).
        ``progressed=False``: no partition progressed since every pending here was made or
        last asked (the lane knows), so one that is ``after_progress`` is not asked. Never
        blocks."""
        slots = self.slots
        frames: FramePieces = []
        if now_ms is None:
            now_ms = self.clock.monotonic_ms()
        while slots:
            slot = slots[0]
            if not slot.filled:
                pending = slot.pending
                if pending is None or pending.ready is None \
                        or (not progressed and pending.after_progress):
                    break
                if type(pending) is OnePartitionWait:  # the commonest answer
                    frame = self.core.send_payload(slot.correlation_id, pending.payload)
                    if frame is not None:
                        slots.popleft()
                        frames.append(frame)
                        self.metrics.request_done(slot.api, 0, now_ms - slot.start_ms)
                        continue
                try:  # ``_guarded``, inline: asked of every produce once or twice
                    response = pending.ready()
                except (SyncFailedError, AssertionError):
                    raise
                except Exception:
                    response = _handler_failed(slot.api)
                if response is None:
                    break
                slot.pending = None
                slot.response = response
                slot.filled = True
            slots.popleft()
            response = slot.response
            assert response is not None
            try:  # (inline: every answer's path)
                frame = self.core.send_response(slot.correlation_id, response)
            except LocalProtocolError as exc:
                frame = self._unencodable(slot, exc)
            if type(frame) is bytes:
                frames.append(frame)
            else:
                frames += frame  # type: ignore[arg-type]
            self.metrics.request_done(slot.api, _error_code(response), now_ms - slot.start_ms)
        return frames

    async def _settle_head(self) -> None:
        """Answer the head slot's produce: at once if durable, else when its wait ends."""
        slot = self.slots[0]
        pending = slot.pending
        assert pending is not None and pending.ready is not None and not slot.filled
        slot.pending = None
        response = _guarded(slot.api, pending.ready)
        if response is None:
            response = await self._wait(slot, pending)
        slot.response = response
        slot.filled = True

    def _unencodable(self, slot: _Slot, exc: LocalProtocolError) -> bytes | FramePieces:
        """The answer to ``slot`` could not be encoded (too large for a frame): say so."""
        log.warning("cannot encode the %s answer: %s", slot.api, exc)
        return self.core.send_error(slot.correlation_id, exc.code, str(exc))

    async def _send(self, frames: FramePieces) -> None:
        """Send frames in order: each run of bytes joined into one ``send_all``, each
        ``memoryview`` (record bytes of a fetch answer, kept by reference) sent from its own
        buffer, each ``FileRegion`` (record bytes of a fetch answer, in a segment file) sent
        by the kernel (``send_file``) or, on a stream without it, read in and sent. Closes
        the regions."""
        run: list[bytes] = []
        try:
            for piece in [*frames, None]:  # None: the end, flushing the last run
                kind = type(piece)
                if kind is bytes:
                    run.append(piece)  # type: ignore[arg-type]
                    continue
                if run:
                    await self._send_bytes(b"".join(run))  # one piece: joined without a copy
                    run = []
                if kind is memoryview:
                    await self._send_bytes(piece)  # type: ignore[arg-type]
                elif piece is not None:
                    await self._send_region(piece)  # type: ignore[arg-type]
        finally:
            for piece in frames:
                if type(piece) is FileRegion:
                    piece.close()

    async def _send_bytes(self, data: bytes | memoryview) -> None:
        await self.stream.send_all(data)
        self.metrics.bytes_out(len(data))

    async def _send_region(self, region: FileRegion) -> None:
        send_file = getattr(self.stream, "send_file", None)
        if send_file is not None:
            await send_file(region)
        else:
            try:
                data = region.read()
            except OSError as exc:  # the segment shrank under the answer: abandon the frame
                raise trio.BrokenResourceError(f"cannot send {region!r}: {exc}") from exc
            await self.stream.send_all(data)
        self.metrics.bytes_out(len(region))


def _guarded(api: str, call: Callable[[], T]) -> T | ErrorResponse:
    """``call()`` (a handler's ``begin``, or a pending produce's ``ready``), with an unexpected
    exception (a bug) logged and answered, not fatal.

    A failed fsync and a broken invariant are fatal and propagate.
    """
    try:
        return call()
    except (SyncFailedError, AssertionError):
        raise
    except Exception:
        return _handler_failed(api)


def _handler_failed(api: str) -> ErrorResponse:
    """Log the exception being handled (a bug in a handler) and answer it (``_guarded``)."""
    log.exception("the %s handler failed", api)
    return ErrorResponse(ErrorCode.UNKNOWN_SERVER_ERROR, _INTERNAL_ERROR)


def _error_code(response: Response) -> int:
    """The error code a request is counted under: its own, or its first partition's."""
    code = getattr(response, "error_code", None)
    if code is not None and code != ErrorCode.NONE:
        return int(code)
    if isinstance(response, _PARTITIONED_RESPONSES):
        for topic in response.topics:
            for partition in topic.partitions:
                if partition.error_code:
                    return int(partition.error_code)
    elif isinstance(response, MetadataResponse):
        for topic in response.topics:
            if topic.error_code:
                return int(topic.error_code)
    return 0


def _peer_host(stream: trio.abc.Stream) -> str:
    """The client's address for group descriptions ("" when the stream has none)."""
    try:
        peer = stream.socket.getpeername()  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return ""
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


class ClientConnections:
    """The live client connections of a broker, so shutdown can stop them all reading."""

    def __init__(self) -> None:
        self._live: set[_Connection] = set()
        self.empty = trio.Event()
        self.empty.set()

    def __len__(self) -> int:
        return len(self._live)

    def add(self, connection: _Connection) -> None:
        self._live.add(connection)
        self.empty = trio.Event()

    def remove(self, connection: _Connection) -> None:
        self._live.discard(connection)
        if not self._live:
            self.empty.set()

    def stop_reading(self) -> None:
        for connection in list(self._live):
            connection.stop_reading()


async def serve_client_connection(
    stream: trio.abc.Stream,
    handlers: Handlers,
    *,
    settings: ConnectionSettings,
    clock: Clock,
    metrics: BrokerMetrics,
    registry: ClientConnections,
    budget: RequestBudget | None = None,
    on_close: Callable[[], None] | None = None,
    lane: ProduceLane | None = None,
) -> None:
    """Serve one client connection until it ends (see the module docstring); close ``stream``.

    Blocks for the life of the connection. Client misbehaviour and broken sockets end the
    connection quietly.

    Raises:
        SyncFailedError: an fsync failed while a request waited; the broker must stop.
    """
    budget = budget if budget is not None else RequestBudget(0)  # 0: unbounded
    connection = _Connection(stream, handlers, settings, clock, metrics, budget, lane)
    connection.client_host = _peer_host(stream)
    registry.add(connection)
    try:
        async with trio.open_nursery() as nursery:

            async def write_then_end() -> None:
                await connection.write_loop()
                nursery.cancel_scope.cancel()  # nothing more will be sent: drop what is left

            nursery.start_soon(write_then_end)
            nursery.start_soon(connection.watch)
            try:
                reason = await connection.read_loop(nursery)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                reason = "broken"
            connection.reading = False
            connection.wake_writer()
            if reason == "idle":
                metrics.connection_idle_closed()
                nursery.cancel_scope.cancel()
            elif reason == "request_timeout":
                metrics.connection_request_timed_out()
                nursery.cancel_scope.cancel()
            elif reason == "broken":
                nursery.cancel_scope.cancel()
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        connection.release_budget()
        registry.remove(connection)
        if on_close is not None:
            on_close()
        await trio.aclose_forcefully(stream)
