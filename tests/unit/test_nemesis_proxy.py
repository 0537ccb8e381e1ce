"""The nemesis proxy and schedule, against a plain TCP server written here (the proxy is
the system under test; the server only records what reached it)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pytest

from exactly.testing.nemesis.faultlog import FaultLog
from exactly.testing.nemesis.proxy import (
    Answer,
    Direction,
    FaultProxy,
    after,
    contains,
    http_request,
    kafka_request,
)
from exactly.testing.nemesis.schedule import FaultSchedule, Nemesis

pytestmark = pytest.mark.fast


class LineServer:
    """Answers every line ``x`` with ``ok x``; records every line received, with its time."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[tuple[float, bytes]] = []
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            talk = threading.Thread(target=self._talk, args=(conn,), daemon=True)
            self.threads.append(talk)
            talk.start()

    def _talk(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self.received.append((time.monotonic(), line))
                    try:
                        conn.sendall(b"ok " + line + b"\n")
                    except OSError:
                        return

    def lines(self) -> list[bytes]:
        return [line for _, line in self.received]

    def close(self) -> None:
        """Stop serving: a close alone would leave the thread blocked in accept()."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for thread in self.threads:
            thread.join(10)


@pytest.fixture
def server():
    s = LineServer()
    yield s
    s.close()


@pytest.fixture
def proxy(server):
    log = FaultLog()
    with FaultProxy("127.0.0.1", server.port, name="line", log=log) as p:
        yield p


def ask(port: int, line: bytes, timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(line + b"\n")
        return c.recv(4096)


def test_without_faults_bytes_pass_both_ways(proxy, server):
    assert ask(proxy.port, b"hello") == b"ok hello\n"
    assert server.lines() == [b"hello"]


def test_a_delay_holds_the_answer_back_but_keeps_it(proxy):
    proxy.delay(0.4, Direction.DOWN)
    started = time.monotonic()
    assert ask(proxy.port, b"slow") == b"ok slow\n"
    assert time.monotonic() - started >= 0.4


def test_dropped_answers_never_arrive_and_heal_resets_the_connection(proxy, server):
    proxy.drop(Direction.DOWN)
    c = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5)
    c.sendall(b"lost\n")
    with pytest.raises(TimeoutError):
        c.recv(4096)
    assert server.lines() == [b"lost"]  # the request was applied
    assert proxy.heal() == 1
    c.settimeout(5)
    with pytest.raises(ConnectionResetError):
        c.recv(4096)
    c.close()
    assert ask(proxy.port, b"after") == b"ok after\n"


def test_cut_resets_open_connections_mid_stream(proxy):
    c = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    c.sendall(b"one\n")
    assert c.recv(4096) == b"ok one\n"
    assert proxy.cut() == 1
    with pytest.raises(ConnectionResetError):
        c.recv(4096)
    c.close()


def test_a_blackhole_keeps_new_connections_from_the_server_until_healed(proxy, server):
    proxy.blackhole()
    c = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5)
    c.sendall(b"nowhere\n")
    with pytest.raises(TimeoutError):
        c.recv(4096)
    assert server.lines() == []
    proxy.heal()
    c.close()
    assert ask(proxy.port, b"back") == b"ok back\n"


def test_the_answer_to_a_chosen_request_is_cut_after_the_server_applied_it(proxy, server):
    trigger = proxy.on_request(contains(b"COMMIT"), Answer.CUT)
    assert ask(proxy.port, b"BEGIN") == b"ok BEGIN\n"
    c = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    c.sendall(b"COM")
    c.sendall(b"MIT 7\n")  # the pattern spans two chunks
    with pytest.raises(ConnectionResetError):
        c.recv(4096)
    c.close()
    assert trigger.fired.is_set() and trigger.count == 1
    assert server.lines() == [b"BEGIN", b"COMMIT 7"]
    assert ask(proxy.port, b"COMMIT 8") == b"ok COMMIT 8\n"  # one-shot


def test_a_late_request_reaches_the_server_after_the_client_gave_up(proxy, server):
    trigger = proxy.on_request(contains(b"END"), Answer.LATE_REQUEST, delay=0.6)
    c = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.2)
    sent = time.monotonic()
    c.sendall(b"END 1\n")
    with pytest.raises(TimeoutError):
        c.recv(4096)
    c.close()  # the client gave up on this connection
    assert server.lines() == []
    deadline = time.monotonic() + 5
    while not server.lines() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.lines() == [b"END 1"]
    assert server.received[0][0] - sent >= 0.6
    assert trigger.delivered.wait(5)
    assert trigger.answered.wait(5)  # the server answered (to a client no longer there)


def test_a_late_answer_arrives_after_its_delay(proxy):
    proxy.on_request(contains(b"x"), Answer.LATE, delay=0.5)
    c = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.2)
    c.sendall(b"x\n")
    with pytest.raises(TimeoutError):
        c.recv(4096)
    c.settimeout(5)
    assert c.recv(4096) == b"ok x\n"
    c.close()


def kafka_frame(api_key: int, body: bytes = b"\0" * 10) -> bytes:
    payload = struct.pack(">hhi", api_key, 3, 1) + body
    return struct.pack(">i", len(payload)) + payload


def test_the_kafka_matcher_follows_request_frames_across_chunks():
    match = kafka_request(26)()
    stream = kafka_frame(0, b"\x1a" * 40) + kafka_frame(26)
    assert not match(stream[:5])  # a Produce request whose body holds the byte 26
    assert not match(stream[5:30])
    assert match(stream[30:])
    other = kafka_request(26)()
    assert not other(kafka_frame(0, b"\x00\x1a" * 20))


def test_the_http_matcher_sees_request_lines_only():
    match = http_request("PUT", b"_delta_log/")()
    assert not match(b"GET /b/t/_delta_log/0.json HTTP/1.1\r\nHost: x\r\n\r\n")
    assert not match(b"PUT /b/t/part-0.parquet HTTP/1.1\r\n\r\n")
    assert not match(b"PUT /b/t/_delta_log/0000.js")  # the request line goes on
    assert match(b"on HTTP/1.1\r\n")
    again = http_request("PUT", b"_delta_log/")()
    again(b"PUT /b/t/_delta_log/0000.js")
    assert again(b"on HTTP/1.1\r\n")


def test_the_after_matcher_sees_a_commit_only_after_the_statement_it_follows():
    """A SQL catalog's metadata swap: the COMMIT after its UPDATE, not the commits of other
    transactions; either pattern may be split across chunks."""
    match = after(b"UPDATE iceberg_tables", b"COMMIT")()
    assert not match(b"BEGIN; INSERT INTO t VALUES (1); COMMIT")
    assert not match(b"BEGIN; UPDATE iceberg_ta")
    assert not match(b"bles SET metadata_location = $1; COM")
    assert match(b"MIT")
    assert not match(b"COMMIT")  # the next transaction's: no UPDATE before it
    assert match(b"UPDATE iceberg_tables SET x = 1; COMMIT")
    again = after(b"UPDATE iceberg_tables", b"COMMIT")()
    assert not again(b"COMMIT; UPDATE iceberg_tables SET x = 1")
    assert again(b"; COMMIT")


def test_a_schedule_is_drawn_from_its_seed_holds_every_kind_and_replays_from_its_log(tmp_path):
    kinds = ["a", "b", "c"]
    one = FaultSchedule.random(7, kinds, 6, gap=(0.0, 0.01), duration=(0.0, 0.01))
    assert one == FaultSchedule.random(7, kinds, 6, gap=(0.0, 0.01), duration=(0.0, 0.01))
    assert one != FaultSchedule.random(8, kinds, 6, gap=(0.0, 0.01), duration=(0.0, 0.01))
    assert {f.kind for f in one.faults[:3]} == set(kinds)
    held: list[str] = []

    class Hold:
        def __init__(self, fault):
            self.kind = fault.kind

        def __enter__(self):
            held.append(self.kind)

        def __exit__(self, *exc):
            held.append("/" + self.kind)

    log = FaultLog(tmp_path / "faults.jsonl", seed=7)
    nemesis = Nemesis(one, {k: Hold for k in kinds}, log).start()
    assert nemesis.wait(10)
    assert held == [x for f in one.faults for x in (f.kind, "/" + f.kind)]
    assert nemesis.counts() == {k: sum(f.kind == k for f in one.faults) for k in kinds}
    replay = FaultSchedule.from_log(tmp_path / "faults.jsonl")
    assert replay == one
    assert log.counts()["a"] == nemesis.counts()["a"]


def test_an_answer_fault_lets_an_interim_100_continue_through_and_hits_the_final_answer():
    """boto3 sends PUTs with ``Expect: 100-continue``: the body leaves only after the
    interim answer, so a cut on that would test a request that never reached the server."""
    received: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)  # the request line and headers
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            received.append(conn.recv(4096))  # the body
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            with contextlib.suppress(OSError):  # the proxy resets the connection
                conn.recv(4096)

    threading.Thread(target=serve, daemon=True).start()
    with FaultProxy("127.0.0.1", listener.getsockname()[1], name="http") as proxy:
        proxy.on_request(http_request("PUT", b"_delta_log/"), Answer.CUT)
        c = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        c.sendall(b"PUT /b/t/_delta_log/1.json HTTP/1.1\r\nExpect: 100-continue\r\n\r\n")
        assert c.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        c.sendall(b"{}")
        with pytest.raises(ConnectionResetError):
            c.recv(4096)
        c.close()
    assert received == [b"{}"]  # the server stored the body; its answer was cut
    listener.close()
