"""check_compare_and_swap against S3 (S3Proxy, real conditional PUTs), and against the same
server behind the test kit's proxy that makes it a store without compare-and-swap: one that
drops ``If-None-Match`` / ``If-Match`` and overwrites (older MinIO, Ceph RGW...), one that
answers them ``501 NotImplemented``. The probe object is gone after each."""

from __future__ import annotations

import pytest

from exactly.checkpoint.cas_check import check_compare_and_swap
from exactly.checkpoint.store import S3LogStore
from exactly.errors import ConfigError

pytestmark = pytest.mark.server


def objects(s3_server, bucket: str) -> list[str]:
    """Every key of the bucket, listed past any proxy."""
    found = s3_server.boto3_client().list_objects_v2(Bucket=bucket)
    return [obj["Key"] for obj in found.get("Contents", [])]


def test_s3proxy_honours_create_if_absent_and_compare_and_swap_and_keeps_no_probe(
        s3_server, s3_bucket):
    check_compare_and_swap(S3LogStore(f"s3://{s3_bucket}/ck/exactly-job"))
    assert objects(s3_server, s3_bucket) == []


def test_the_kit_store_without_conditions_overwrites_what_a_create_if_absent_meets(
        s3_ignoring_conditions, s3_server, s3_bucket):
    store = S3LogStore(f"s3://{s3_bucket}/log")
    assert store.create("x.json", b"first") is True
    assert store.create("x.json", b"second") is True  # S3Proxy wrote it unconditionally
    assert store.read("x.json") == b"second"
    assert s3_ignoring_conditions.conditions_seen == 2


def test_an_s3_store_that_ignores_conditional_writes_is_refused_naming_both_operations(
        s3_ignoring_conditions, s3_server, s3_bucket):
    store = S3LogStore(f"s3://{s3_bucket}/ck/exactly-job")
    with pytest.raises(ConfigError) as refused:
        check_compare_and_swap(store)
    message = str(refused.value)
    assert message.startswith(f"s3://{s3_bucket}/ck/exactly-job: the store does not honour")
    assert "If-None-Match: *): a second create" in message
    assert "If-Match: <ETag>): a swap of " in message
    assert "`exactly run --ha`" in message and "AWS S3" in message
    assert s3_ignoring_conditions.conditions_seen > 0  # the probe went through the proxy
    assert objects(s3_server, s3_bucket) == []


def test_an_s3_store_that_answers_501_to_conditional_writes_is_refused(
        s3_refusing_conditions, s3_server, s3_bucket):
    store = S3LogStore(f"s3://{s3_bucket}/ck/exactly-job")
    with pytest.raises(ConfigError) as refused:
        check_compare_and_swap(store)
    message = str(refused.value)
    assert message.startswith(f"s3://{s3_bucket}/ck/exactly-job: the store refuses "
                              "create-if-absent")
    assert "`exactly run --ha`" in message and "AWS S3" in message
    assert "refuses conditional writes" in str(refused.value.__cause__)  # S3LogStore's 501
    assert s3_refusing_conditions.conditions_seen == 1
    assert objects(s3_server, s3_bucket) == []
