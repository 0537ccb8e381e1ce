"""The ambiguous commit on S3 (issue 28): a conditional PUT of the protocol's records or of a
Delta commit whose answer is lost after S3Proxy applied it (the connection cut as the answer
comes: :attr:`Answer.CUT`), or held past the client's read timeout (:attr:`Answer.LATE`), or
whose request itself arrives late (:attr:`Answer.LATE_REQUEST`), through the nemesis proxy of
the test kit. The client sends the PUT again and is refused (412: the object exists now, or
its ETag moved): the caller must still get the truth -- it won, or a real competitor won --
resolved by the object itself or the Delta table's ``txn`` version and files, never a false
"fenced", never an epoch committed twice."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from exactly.checkpoint.store import S3LogStore
from exactly.connectors.delta.sink import DeltaSink, app_id
from exactly.protocol.commitlog import CommitLog
from exactly.protocol.contract import SinkSettings
from exactly.protocol.faults import FaultPoint
from exactly.testing.harness import ProtocolHarness, SimulatedCrash
from exactly.testing.nemesis.proxy import Answer, FaultProxy, http_request

pytestmark = pytest.mark.server

#: the read timeout of the clients under a late answer (seconds), and the lateness
TIMEOUT_S = 1.0
LATE_S = 3.0
SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture
def proxy(s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """The nemesis between every client of the test and S3Proxy: ``AWS_ENDPOINT_URL`` names
    the proxy (boto3's commit log and lease, PyArrow's data files, deltalake's commits)."""
    with FaultProxy("127.0.0.1", s3_server.port, name="s3").start() as p:
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
@pytest.mark.parametrize("answer", [Answer.CUT, Answer.LATE, Answer.LATE_REQUEST])
def test_a_conditional_create_whose_answer_is_lost_or_late_is_won_not_refused(
        proxy, s3_server, s3_bucket, answer):
    store = S3LogStore(f"s3://{s3_bucket}/log", read_timeout=TIMEOUT_S)
    fault = proxy.on_request(http_request("PUT", b"intents/"), answer, delay=LATE_S)
    assert store.create("intents/1.json", b"mine") is True
    assert fault.count == 1
    assert direct(s3_server, s3_bucket, "log/intents/1.json") == b"mine"


@pytest.mark.parametrize("answer", [Answer.CUT, Answer.LATE])
def test_a_conditional_create_a_competitor_won_stays_refused_under_a_lost_answer(
        proxy, s3_server, s3_bucket, answer):
    store = S3LogStore(f"s3://{s3_bucket}/log", read_timeout=TIMEOUT_S)
    assert store.create("intents/1.json", b"theirs") is True
    fault = proxy.on_request(http_request("PUT", b"intents/"), answer, delay=LATE_S)
    assert store.create("intents/1.json", b"mine") is False
    assert fault.count == 1
    assert direct(s3_server, s3_bucket, "log/intents/1.json") == b"theirs"


@pytest.mark.parametrize("answer", [Answer.CUT, Answer.LATE, Answer.LATE_REQUEST])
def test_a_compare_and_swap_whose_answer_is_lost_or_late_is_won_not_refused(
        proxy, s3_server, s3_bucket, answer):
    store = S3LogStore(f"s3://{s3_bucket}/log", read_timeout=TIMEOUT_S)
    store.write("lease.json", b"v1")
    _, token = store.read_versioned("lease.json")
    fault = proxy.on_request(http_request("PUT", b"lease.json"), answer, delay=LATE_S)
    assert store.swap("lease.json", b"v2", token) is True
    assert fault.count == 1
    assert direct(s3_server, s3_bucket, "log/lease.json") == b"v2"
    _, newer = store.read_versioned("lease.json")
    assert store.swap("lease.json", b"v3", newer) is True
    if answer is Answer.LATE_REQUEST:  # the held request reaches the store at last: refused
        fault.delivered.wait(LATE_S * 4)
    assert direct(s3_server, s3_bucket, "log/lease.json") == b"v3"


def test_a_compare_and_swap_a_competitor_won_stays_refused_under_a_lost_answer(
        proxy, s3_server, s3_bucket):
    store = S3LogStore(f"s3://{s3_bucket}/log", read_timeout=TIMEOUT_S)
    store.write("lease.json", b"v1")
    _, token = store.read_versioned("lease.json")
    store.write("lease.json", b"theirs")
    fault = proxy.on_request(http_request("PUT", b"lease.json"), Answer.CUT)
    assert store.swap("lease.json", b"mine", token) is False
    assert fault.count == 1
    assert direct(s3_server, s3_bucket, "log/lease.json") == b"theirs"
