"""S3 log stores share one boto3 client per process and settings: a sink opens its commit log
and lease every epoch, and making a client costs tens of milliseconds."""

from __future__ import annotations

from exactly.checkpoint.store import S3LogStore


def test_stores_share_a_client_until_the_aws_settings_change(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    first = S3LogStore("s3://bucket/one").client
    assert S3LogStore("s3://bucket/two").client is first
    assert S3LogStore("s3://bucket/one", read_timeout=5).client is not first
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:10")  # another store
    other = S3LogStore("s3://bucket/one").client
    assert other is not first
    assert other.meta.endpoint_url == "http://127.0.0.1:10"
