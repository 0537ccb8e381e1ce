"""The ambiguous commit on S3 (issue 28), through the nemesis proxy of the test kit: a
conditional PUT of the protocol's records (create if absent, compare-and-swap) or of a Delta
commit (``_delta_log/N.json``) whose answer is lost after S3Proxy applied it (DROP, CUT),
held past the client's timeout (LATE), or whose request itself arrives late (LATE_REQUEST).
boto3 sends the PUT again and is refused (412: the object exists now, or its ETag moved);
deltalake does not send it again and fails. The caller must still get the truth -- it won,
or a real competitor won -- from the object itself or the table's ``txn`` version and files:
never a false "fenced", never an epoch committed twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from exactly.checkpoint.store import S3LogStore
from exactly.connectors.delta.sink import DeltaSink, app_id
from exactly.protocol.contract import SinkSettings
from exactly.protocol.faults import FaultPoint
from exactly.testing.harness import ProtocolHarness
from exactly.testing.nemesis.proxy import Answer, FaultProxy, http_request
from exactly.testing.waits import wait_until

pytestmark = pytest.mark.server

#: the read timeout of the clients under a late answer (seconds), and the lateness
TIMEOUT_S = 2.0
LATE_S = 4.0
SCHEMA = pa.schema([("id", pa.int64())])
#: the answer faults, as boto3 meets them (measured): it sends a PUT with ``Expect:
#: 100-continue``, so CUT resets the connection at the interim ``100 Continue`` before the body
#: left (nothing applied: the retry wins plainly); DROP loses the final answer (botocore sends
#: the body after 1 s without the 100) and LATE holds it past the read timeout: the store
#: applied the PUT, boto3's retry is refused with 412; LATE_REQUEST: the retry arrives first
LOST = [Answer.CUT, Answer.DROP, Answer.LATE, Answer.LATE_REQUEST]


@pytest.fixture
def proxy(s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """The nemesis between every client of the test and S3Proxy: ``AWS_ENDPOINT_URL`` names
    the proxy (boto3's commit log and lease, PyArrow's data files, deltalake's commits)."""
    with FaultProxy("127.0.0.1", s3_server.port, name="s3") as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{p.port}")
        yield p


def direct(s3_server: Any, bucket: str, key: str) -> bytes | None:
    """The object as S3Proxy holds it, read past the proxy."""
    client = s3_server.boto3_client()
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


# -- a. the store's conditional create and replace ------------------------------------------
@pytest.mark.parametrize("answer", LOST)
def test_a_conditional_create_whose_answer_is_lost_or_late_is_won_not_refused(
        proxy, s3_server, s3_bucket, answer):
    store = S3LogStore(f"s3://{s3_bucket}/log", read_timeout=TIMEOUT_S)
    fault = proxy.on_request(http_request("PUT", b"intents/"), answer, delay=LATE_S)
    assert store.create("intents/1.json", b"mine") is True
    assert fault.count == 1
    assert direct(s3_server, s3_bucket, "log/intents/1.json") == b"mine"


def test_a_conditional_create_a_competitor_won_stays_refused_under_a_lost_answer(
        proxy, s3_server, s3_bucket):
    store = S3LogStore(f"s3://{s3_bucket}/log", read_timeout=TIMEOUT_S)
    assert store.create("intents/1.json", b"theirs") is True
    fault = proxy.on_request(http_request("PUT", b"intents/"), Answer.DROP)
    assert store.create("intents/1.json", b"mine") is False
    assert fault.count == 1
    assert direct(s3_server, s3_bucket, "log/intents/1.json") == b"theirs"


@pytest.mark.parametrize("answer", LOST)
def test_a_compare_and_swap_whose_answer_is_lost_or_late_is_won_not_refused(
        proxy, s3_server, s3_bucket, answer):
    store = S3LogStore(f"s3://{s3_bucket}/log", read_timeout=TIMEOUT_S)
    store.write("lease.json", b"v1")
    _, token = store.read_versioned("lease.json")
    fault = proxy.on_request(http_request("PUT", b"lease.json"), answer, delay=LATE_S)
    sent = time.monotonic()
    assert store.swap("lease.json", b"v2", token) is True
    assert fault.count == 1
    assert direct(s3_server, s3_bucket, "log/lease.json") == b"v2"
    _, newer = store.read_versioned("lease.json")
    assert store.swap("lease.json", b"v3", newer) is True
    if answer is Answer.LATE_REQUEST:
        # the held request (If-Match: v1) reaches S3Proxy LATE_S after it was sent, after v3
        # (nothing tells the test when S3Proxy answered it: a slow answer leaves this check
        # without its late request, it cannot fail falsely)
        time.sleep(max(0.0, sent + LATE_S + 1 - time.monotonic()))
    assert direct(s3_server, s3_bucket, "log/lease.json") == b"v3"


def test_a_compare_and_swap_a_competitor_won_stays_refused_under_a_lost_answer(
        proxy, s3_server, s3_bucket):
    store = S3LogStore(f"s3://{s3_bucket}/log", read_timeout=TIMEOUT_S)
    store.write("lease.json", b"v1")
    _, token = store.read_versioned("lease.json")
    store.write("lease.json", b"theirs")
    fault = proxy.on_request(http_request("PUT", b"lease.json"), Answer.DROP)
    assert store.swap("lease.json", b"mine", token) is False
    assert fault.count == 1
    assert direct(s3_server, s3_bucket, "log/lease.json") == b"theirs"


# -- b. the commit log's records and a restart's recovery ------------------------------------
def delta_harness(s3_server: Any, bucket: str, proxy: FaultProxy,
                  query_id: str | None = None) -> ProtocolHarness[DeltaSink]:
    """A query writing to a Delta table on S3 with its commit log and lease beside it, every
    request through ``proxy``; the clients give up on an answer after :data:`TIMEOUT_S`."""
    table, log = f"s3://{bucket}/table", f"s3://{bucket}/log"
    # created past the proxy: deltalake 1.6's is_deltatable holds the GIL while it waits for
    # the store (measured), so the proxy's thread in this process could not forward it
    DeltaSink(table, log, storage_options=s3_server.storage_options()).prepare_target(SCHEMA)
    options = {**s3_server.storage_options(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
               "timeout": f"{TIMEOUT_S:g}s"}
    sink = DeltaSink(table, log, storage_options=options)
    h = ProtocolHarness(sink, SinkSettings(log_dir=f"s3://{bucket}/log"), query_id=query_id)
    impatient(h)
    return h


def impatient(h: ProtocolHarness[DeltaSink]) -> None:
    """The current driver's commit log and lease give up on an answer after TIMEOUT_S (the
    product's clients wait botocore's 60 s)."""
    uri = str(h.sink.log_directory)
    h.committer.log.store = S3LogStore(uri, read_timeout=TIMEOUT_S)
    h.committer.lease.store = S3LogStore(uri, read_timeout=TIMEOUT_S)


def batch(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": ids}, schema=SCHEMA)


def table_of(s3_server: Any, bucket: str) -> DeltaTable:
    """The table as a reader past the proxy sees it."""
    return DeltaTable(f"s3://{bucket}/table", storage_options=s3_server.storage_options())


def epochs_committed(table: DeltaTable, query_id: str) -> list[int]:
    """The epoch of every Delta commit of ``query_id``, in version order (once each, if
    no epoch was committed twice)."""
    return [int(c["exactly.epoch"]) for c in sorted(table.history(), key=lambda c: c["version"])
            if c.get("exactly.queryId") == query_id]


def test_an_intent_and_a_completion_whose_answers_are_lost_commit_the_epoch_once(
        proxy, s3_server, s3_bucket):
    """The intent's answer is dropped, the completion's comes too late: the intent (create
    if absent) is recognised as this run's, the completion is a plain PUT that boto3 sends
    again. No false "fenced", and the log agrees with the table."""
    h = delta_harness(s3_server, s3_bucket, proxy)
    h.run_epoch(0, [batch([1, 2]), batch([3])])
    intent = proxy.on_request(http_request("PUT", b"/log/intents/"), Answer.DROP)
    complete = proxy.on_request(http_request("PUT", b"/log/complete/"), Answer.LATE,
                                delay=LATE_S)
    h.run_epoch(1, [batch([4]), batch([5, 6])])
    assert (intent.count, complete.count) == (1, 1)
    assert h.log.completed_epochs() == [0, 1] and h.incomplete_intents() == []
    table = table_of(s3_server, s3_bucket)
    assert table.transaction_version(app_id(h.query_id)) == 1
    assert epochs_committed(table, h.query_id) == [0, 1]
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 4, 5, 6]


def test_a_restart_whose_lease_takeover_answer_is_lost_still_recovers(
        proxy, s3_server, s3_bucket):
    """A new run takes the lease over with a compare-and-swap whose answer is lost: it is
    still a new run, so it recovers -- finishes the crashed run's intent and aborts its
    orphaned pre-commit -- before any replay."""
    h = delta_harness(s3_server, s3_bucket, proxy)
    h.run_epoch(0, [batch([1, 2])])
    with h.crash_at(FaultPoint.AFTER_INTENT, 1):
        h.run_epoch(1, [batch([3]), batch([4])])
    crashed = h.run_id
    h.restart()
    h.tasks(2, [batch([99])], run=crashed)  # a task of the crashed run's next epoch: an orphan
    impatient(h)
    takeover = proxy.on_request(http_request("PUT", b"/log/lease.json"), Answer.DROP)
    assert h.recover() is True
    assert takeover.count == 1
    assert h.log.completed_epochs() == [0, 1] and h.pre_commits() == []
    table = table_of(s3_server, s3_bucket)
    assert table.transaction_version(app_id(h.query_id)) == 1
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 4]


# -- c. a Delta commit whose answer is lost ----------------------------------------------------
@pytest.mark.parametrize("answer", [Answer.CUT, Answer.DROP, Answer.LATE, Answer.LATE_REQUEST])
def test_a_delta_commit_whose_answer_is_lost_holds_the_epoch_once(
        proxy, s3_server, s3_bucket, answer):
    """deltalake does not send the PUT of ``_delta_log/N.json`` again (measured: an OSError
    "Generic S3 error" after a cut or a timeout, with the commit stored). The sink reads the
    table's ``txn`` version and files: the epoch is committed, once. A request that arrives
    after the client gave up (LATE_REQUEST) may not be there yet when the sink looks: the call
    fails, and the next run's recovery finds the epoch in the table."""
    h = delta_harness(s3_server, s3_bucket, proxy)
    h.run_epoch(0, [batch([1, 2])])
    fault = proxy.on_request(http_request("PUT", b"/_delta_log/"), answer, delay=LATE_S)
    try:
        h.run_epoch(1, [batch([3]), batch([4])])
    except OSError:
        assert answer is Answer.LATE_REQUEST  # the commit was not in the table yet
        wait_until(lambda: table_of(s3_server, s3_bucket).transaction_version(
            app_id(h.query_id)) == 1, "the late commit to reach the table", 30)
        h.restart()
        impatient(h)
        assert h.recover() is True
    assert fault.count == 1
    h.run_epoch(1, [batch([3]), batch([4])])  # Spark's replay: the table holds it already
    h.run_epoch(2, [batch([5])])
    table = table_of(s3_server, s3_bucket)
    assert table.transaction_version(app_id(h.query_id)) == 2
    assert epochs_committed(table, h.query_id) == [0, 1, 2]
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 4, 5]
    assert h.log.completed_epochs() == [0, 1, 2] and h.pre_commits() == []


def test_a_delta_commit_sent_again_after_its_first_put_landed_unseen_is_recognised_not_fenced(
        proxy, s3_server, s3_bucket):
    """An epoch's commit stored while its writer saw nothing (a late request landing after
    the sink read the table), then published again from the older view: deltalake finds
    the version taken by a commit with the query's own ``txn`` and calls it a concurrent
    transaction (CommitFailedError). The table holds the epoch with these very files: the
    sink recognises its own commit instead of declaring itself fenced, and adds nothing."""
    h = delta_harness(s3_server, s3_bucket, proxy)
    handles = h.tasks(0, [batch([1, 2]), batch([3])])
    older = DeltaTable(h.sink.uri, storage_options=h.sink.location.resolved_options())
    h.commit(0, handles)
    views = iter([older])  # the next read of the table is the one before the commit
    fresh = h.sink._delta
    h.sink._delta = lambda **_: next(views, None) or fresh()  # type: ignore[method-assign]
    h.sink.publish_epoch(0, handles)
    table = table_of(s3_server, s3_bucket)
    assert epochs_committed(table, h.query_id) == [0]
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]
