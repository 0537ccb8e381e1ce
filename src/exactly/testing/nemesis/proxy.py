"""A TCP proxy on 127.0.0.1 that injects network faults between a client and one server.

Clients connect to :attr:`FaultProxy.port` instead of the server; every connection is
forwarded to the server, byte for byte, until a fault is set:

* :meth:`~FaultProxy.delay` -- every byte in one direction arrives later (order kept);
* :meth:`~FaultProxy.drop` -- every byte in one direction is lost; the connections stay open
  (the peer waits for an answer that never comes) until :meth:`~FaultProxy.heal`, which
  resets them: their streams have a gap, as after a long partition;
* :meth:`~FaultProxy.blackhole` -- a partition: new connections are accepted but never reach
  the server, open ones lose every byte both ways;
* :meth:`~FaultProxy.cut` -- every open connection is reset (RST) now, mid-stream;
* :meth:`~FaultProxy.on_request` -- the ambiguous commit: when a client sends a chosen
  request (a byte pattern, a Kafka API key, an HTTP method and path), the request reaches the
  server, and then its answer is lost (:attr:`Answer.DROP`), the connection is reset as the
  answer comes (:attr:`Answer.CUT`), the answer is held and delivered late
  (:attr:`Answer.LATE`), or the request itself is held and reaches the server late, even
  after the client gave up on that connection (:attr:`Answer.LATE_REQUEST`).

Bytes a client sent before it closed its side are still delivered to the server (a late
packet on a connection the client already abandoned is what makes :attr:`Answer.LATE_REQUEST`
dangerous). Every fault goes to the :class:`~exactly.testing.nemesis.faultlog.FaultLog`
when one is given. The proxy runs an asyncio loop in a daemon thread; its methods are
thread-safe and take effect before they return.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from exactly.testing.nemesis.faultlog import FaultLog

#: how long a connection whose client left waits for the answer to its late request
LATE_ANSWER_WAIT_S = 10.0
#: a per-connection matcher: fed every chunk the client sends, True when the request is seen
Matcher = Callable[[bytes], bool]
#: makes a fresh matcher for each connection (matchers keep state across chunks)
MatcherFactory = Callable[[], Matcher]


class Direction(str, Enum):
    UP = "up"  # client -> server
    DOWN = "down"  # server -> client
    BOTH = "both"

    def covers(self, other: Direction) -> bool:
        return self is Direction.BOTH or self is other


class Answer(str, Enum):
    DROP = "drop"  # the request is applied, its answer lost; the connection hangs
    CUT = "cut"  # the request is applied, the connection is reset as the answer comes
    LATE = "late"  # the answer is held ``delay`` seconds, then delivered
    LATE_REQUEST = "late_request"  # the request is held ``delay`` seconds, then delivered


# -- matchers ------------------------------------------------------------------------------
def contains(needle: bytes) -> MatcherFactory:
    """Matches when the client's stream contains ``needle`` (across chunk boundaries);
    e.g. ``contains(b"COMMIT PREPARED")`` for PostgreSQL's simple and extended protocols."""
    if not needle:
        raise ValueError("contains() needs a non-empty pattern")

    def factory() -> Matcher:
        tail = b""

        def match(chunk: bytes) -> bool:
            nonlocal tail
            data = tail + chunk
            tail = data[-(len(needle) - 1):] if len(needle) > 1 else b""
            return needle in data
        return match
    return factory


def after(first: bytes, then: bytes) -> MatcherFactory:
    """Matches when the client's stream contains ``then`` after ``first`` (either across
    chunk boundaries; once matched, it looks for ``first`` again): e.g. ``after(b"UPDATE
    iceberg_tables", b"COMMIT")``, the commit of a SQL catalog's swap of a table's metadata
    pointer -- not the commits of the other transactions on the same connection."""
    if not first or not then:
        raise ValueError("after() needs two non-empty patterns")

    def factory() -> Matcher:
        kept = b""  # the bytes a pattern may continue from
        armed = False  # ``first`` seen: looking for ``then``

        def match(chunk: bytes) -> bool:
            nonlocal kept, armed
            data = kept + chunk
            if not armed:
                at = data.find(first)
                if at < 0:
                    kept = data[len(data) - len(first) + 1:] if len(first) > 1 else b""
                    return False
                armed, data = True, data[at + len(first):]
            at = data.find(then)
            if at < 0:
                kept = data[len(data) - len(then) + 1:] if len(then) > 1 else b""
                return False
            armed, kept = False, data[at + len(then):]
            return True
        return match
    return factory


def kafka_request(api_key: int) -> MatcherFactory:
    """Matches when the client sends a Kafka request with this API key (EndTxn 26,
    AddOffsetsToTxn 25, TxnOffsetCommit 28, InitProducerId 22, Produce 0): it follows the
    size-prefixed request frames of the connection."""

    def factory() -> Matcher:
        buf = bytearray()
        skip = 0  # bytes of the current frame still to pass over

        def match(chunk: bytes) -> bool:
            nonlocal skip
            buf.extend(chunk)
            found = False
            while True:
                if skip:
                    n = min(skip, len(buf))
                    del buf[:n]
                    skip -= n
                    if skip:
                        return found
                if len(buf) < 6:
                    return found
                (size,) = struct.unpack(">i", buf[:4])
                (key,) = struct.unpack(">h", buf[4:6])
                found = found or key == api_key
                skip = size + 4
        return match
    return factory


def http_request(method: str, path_contains: bytes = b"") -> MatcherFactory:
    """Matches an HTTP/1.x request line with this method whose target contains
    ``path_contains`` (e.g. ``http_request("PUT", b"_delta_log/")``)."""
    pattern = re.compile(rb"(?:^|\n)" + re.escape(method.encode()) + rb" (\S*"
                         + re.escape(path_contains) + rb"\S*) HTTP/1\.[01]\r\n")

    def factory() -> Matcher:
        tail = b""

        def match(chunk: bytes) -> bool:
            nonlocal tail
            data = tail + chunk
            tail = data[-4096:]
            if pattern.search(data):
                tail = b""
                return True
            return False
        return match
    return factory


def _interim_http(chunk: bytes) -> bool:
    """An HTTP/1.x interim response (``100 Continue``) alone: an answer fault waits for the
    final response (boto3 sends PUTs with ``Expect: 100-continue``)."""
    return (chunk.startswith(b"HTTP/1.") and chunk[9:10] == b"1"
            and chunk.endswith(b"\r\n\r\n") and chunk.count(b"\r\n\r\n") == 1)


# -- triggers --------------------------------------------------------------------------------
@dataclass
class Trigger:
    """A one-shot (or ``times``-shot) answer fault armed by :meth:`FaultProxy.on_request`."""

    factory: MatcherFactory
    answer: Answer
    delay: float
    times: int
    fired: threading.Event = field(default_factory=threading.Event)
    #: set when a request held by :attr:`Answer.LATE_REQUEST` has been handed to the server
    delivered: threading.Event = field(default_factory=threading.Event)
    #: set when the server answered a request delivered late (it handled it)
    answered: threading.Event = field(default_factory=threading.Event)
    count: int = 0

    def take(self) -> bool:
        if self.count >= self.times:
            return False
        self.count += 1
        if self.count >= self.times:
            self.fired.set()
        return True

    @property
    def spent(self) -> bool:
        return self.count >= self.times


class _Conn:
    """One proxied connection: two pumps (client->server, server->client)."""

    def __init__(self, proxy: FaultProxy, number: int, client: tuple[Any, Any]) -> None:
        self.proxy = proxy
        self.number = number
        self.client_reader, self.client_writer = client
        self.server_writer: Any = None
        self.gapped = False  # lost bytes: the connection must be reset when healed
        self.matchers: dict[int, Matcher] = {}
        self.answer: Answer | None = None  # an answer fault this connection carries
        self.up_hold_until = 0.0
        self.down_hold_until = 0.0
        self.late_request: Trigger | None = None  # a held request not yet delivered
        self.delivered: Trigger | None = None  # a held request delivered, its answer awaited
        self.closed = False

    def matcher(self, trigger: Trigger) -> Matcher:
        key = id(trigger)
        if key not in self.matchers:
            self.matchers[key] = trigger.factory()
        return self.matchers[key]

    def reset(self) -> None:
        """Abort both sides with a TCP RST (SO_LINGER 0)."""
        self.closed = True
        for writer in (self.client_writer, self.server_writer):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


class FaultProxy:
    """Forward ``127.0.0.1:port`` to ``upstream_host:upstream_port`` and inject faults.

    ``listen_port=0`` picks a free port (:attr:`port` after :meth:`start`); a fixed port lets
    a server advertise the proxy's address before the proxy starts (Kafka listeners).
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, name: str = "proxy",
                 log: FaultLog | None = None, listen_port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.name = name
        self.log = log
        self.port = listen_port
        self.connections_total = 0
        self._delay = {Direction.UP: 0.0, Direction.DOWN: 0.0}
        self._drop = {Direction.UP: False, Direction.DOWN: False}
        self._blackhole = False
        self._conns: set[_Conn] = set()
        self._held: set[Any] = set()  # client writers of connections a blackhole holds
        self._triggers: list[Trigger] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name=f"fault-proxy-{name}", daemon=True)
        self._server: asyncio.Server | None = None

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._server = self._call(self._listen())
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", self.port,
                                          reuse_address=True)

    def stop(self) -> None:
        """Close the listener and reset every connection."""
        if not self._thread.is_alive():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self._reset_all(gapped_only=False)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    # -- faults --------------------------------------------------------------------------
    def delay(self, seconds: float, direction: Direction = Direction.BOTH) -> None:
        """Every byte in ``direction`` arrives ``seconds`` later (0 ends the delay)."""
        self._record("delay", direction=direction.value, seconds=seconds)
        for d in (Direction.UP, Direction.DOWN):
            if direction.covers(d):
                self._delay[d] = seconds

    def drop(self, direction: Direction = Direction.BOTH) -> None:
        """Lose every byte in ``direction`` until :meth:`heal`."""
        self._record("drop", direction=direction.value)
        for d in (Direction.UP, Direction.DOWN):
            if direction.covers(d):
                self._drop[d] = True

    def blackhole(self) -> None:
        """Partition the server away until :meth:`heal`."""
        self._record("blackhole")
        self._blackhole = True

    def cut(self) -> int:
        """Reset every open connection now; returns how many."""
        count = self._call(self._async_reset_all(gapped_only=False))
        self._record("cut", connections=count)
        return count

    def on_request(self, matcher: MatcherFactory, answer: Answer, *, delay: float = 0.0,
                   times: int = 1) -> Trigger:
        """Arm an answer fault for the next ``times`` requests ``matcher`` recognizes."""
        if answer in (Answer.LATE, Answer.LATE_REQUEST) and delay <= 0:
            raise ValueError(f"{answer.value} needs a delay > 0")
        trigger = Trigger(matcher, answer, delay, times)
        self._triggers.append(trigger)
        self._record("answer_armed", answer=answer.value, delay=delay, times=times)
        return trigger

    def heal(self) -> int:
        """End every fault (delays, drops, the partition, armed triggers); connections that
        lost bytes and connections the partition held are reset. Returns how many."""
        self._delay = {Direction.UP: 0.0, Direction.DOWN: 0.0}
        self._drop = {Direction.UP: False, Direction.DOWN: False}
        self._blackhole = False
        self._triggers = []
        count = self._call(self._async_reset_all(gapped_only=True))
        self._record("heal", connections_reset=count)
        return count

    # -- internals -----------------------------------------------------------------------
    def _record(self, kind: str, **params: Any) -> None:
        if self.log is not None:
            self.log.record(f"net.{kind}", self.name, **params)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _async_reset_all(self, *, gapped_only: bool) -> int:
        return self._reset_all(gapped_only=gapped_only)

    def _reset_all(self, *, gapped_only: bool) -> int:
        count = 0
        for conn in list(self._conns):
            if not gapped_only or conn.gapped or conn.answer is Answer.DROP:
                conn.reset()
                self._conns.discard(conn)
                count += 1
        for writer in list(self._held):
            with contextlib.suppress(Exception):
                writer.transport.abort()
            count += 1
        self._held.clear()
        return count

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        if self._blackhole:
            await self._hold(reader, writer)
            return
        conn = _Conn(self, self.connections_total, (reader, writer))
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            conn.reset()
            return
        conn.server_writer = server_writer
        self._conns.add(conn)
        up: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        down: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        try:
            await asyncio.gather(
                self._read(conn, reader, up, Direction.UP),
                self._write(conn, server_writer, up),
                self._read(conn, server_reader, down, Direction.DOWN),
                self._write(conn, writer, down))
        finally:
            self._conns.discard(conn)
            if not conn.closed:
                for w in (writer, server_writer):
                    with contextlib.suppress(Exception):
                        w.close()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection made during a partition: read and lose its bytes until healed."""
        self._held.add(writer)
        with contextlib.suppress(Exception):
            while await reader.read(65536):
                pass
        self._held.discard(writer)
        with contextlib.suppress(Exception):
            writer.transport.abort()

    async def _read(self, conn: _Conn, reader: asyncio.StreamReader,
                    queue: asyncio.Queue[tuple[float, bytes] | None],
                    direction: Direction) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                now = loop.time()
                if direction is Direction.UP:
                    self._check_triggers(conn, data, now)
                    hold = conn.up_hold_until
                else:
                    if conn.delivered is not None:
                        conn.delivered.answered.set()
                        conn.delivered = None
                    if conn.answer in (Answer.CUT, Answer.DROP) and _interim_http(data):
                        pass  # "100 Continue": the request's body is still to come
                    elif conn.answer is Answer.CUT:
                        self._record("answer_cut", connection=conn.number)
                        conn.reset()
                        break
                    elif conn.answer is Answer.DROP:
                        conn.gapped = True
                        continue
                    hold = conn.down_hold_until
                if self._drop[direction] or self._blackhole:
                    conn.gapped = True
                    continue
                queue.put_nowait((max(now + self._delay[direction], hold), data))
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait(None)

    def _check_triggers(self, conn: _Conn, data: bytes, now: float) -> None:
        for trigger in list(self._triggers):
            if trigger.spent or not conn.matcher(trigger)(data):
                continue
            if not trigger.take():
                continue
            conn.answer = trigger.answer
            if trigger.answer is Answer.LATE:
                conn.down_hold_until = now + trigger.delay
            elif trigger.answer is Answer.LATE_REQUEST:
                conn.up_hold_until = now + trigger.delay
                conn.late_request = trigger
            self._record("answer_fault", answer=trigger.answer.value, delay=trigger.delay,
                         connection=conn.number)

    async def _write(self, conn: _Conn, writer: asyncio.StreamWriter,
                     queue: asyncio.Queue[tuple[float, bytes] | None]) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    pending = conn.delivered
                    if pending is not None and writer is conn.server_writer:
                        # a late request's client is gone: give the server time to answer
                        # it before it sees the end of the stream (it may drop the request)
                        deadline = loop.time() + LATE_ANSWER_WAIT_S
                        while not pending.answered.is_set() and loop.time() < deadline:
                            await asyncio.sleep(0.05)
                    if not conn.closed and writer.can_write_eof():
                        writer.write_eof()
                    return
                due, data = item
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if conn.closed:
                    return
                writer.write(data)
                await writer.drain()
                late = conn.late_request
                if (late is not None and writer is conn.server_writer
                        and loop.time() >= conn.up_hold_until):
                    conn.late_request = None
                    conn.delivered = late
                    late.delivered.set()
                    self._record("late_request_delivered", connection=conn.number)
        except (ConnectionError, OSError, RuntimeError):
            # the peer is gone: drain the queue so the reader is never blocked
            while not queue.empty():
                queue.get_nowait()
