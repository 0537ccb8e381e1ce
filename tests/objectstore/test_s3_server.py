"""The throw-away S3-compatible server (exactly.testing.s3_server, S3Proxy) keeps the
promises object-store sinks are tested against: round trips, conditional writes refused with
412, objects that survive a SIGKILL, and a Delta table written and read through deltalake.

The server is the session fixture ``s3_server`` (exactly.testing.pytest_plugin); each test
uses a bucket of its own.
"""

from __future__ import annotations

import hashlib
import uuid

import pytest

from exactly.errors import ConfigError
from exactly.testing import s3_server as s3

pytestmark = pytest.mark.server


@pytest.fixture
def bucket(s3_server) -> str:
    """A fresh bucket on the session's server."""
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


def _error(exc_info) -> tuple[str, int]:
    response = exc_info.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_an_object_put_is_read_back_byte_for_byte_with_its_md5_as_etag(s3_server, bucket):
    client = s3_server.boto3_client()
    body = bytes(range(256)) * 64
    put = client.put_object(Bucket=bucket, Key="dir/object.bin", Body=body)
    assert put["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    got = client.get_object(Bucket=bucket, Key="dir/object.bin")
    assert got["Body"].read() == body
    assert got["ETag"] == put["ETag"]
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("dir/object.bin", len(body))]


def test_if_none_match_star_refuses_an_existing_key_with_412_and_leaves_it(s3_server, bucket):
    from botocore.exceptions import ClientError

    client = s3_server.boto3_client()
    client.put_object(Bucket=bucket, Key="commit/0", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=bucket, Key="commit/0", Body=b"second", IfNoneMatch="*")
    assert _error(info) == ("PreconditionFailed", 412)
    assert client.get_object(Bucket=bucket, Key="commit/0")["Body"].read() == b"first"


def test_if_match_refuses_a_stale_etag_and_accepts_the_current_one(s3_server, bucket):
    from botocore.exceptions import ClientError

    client = s3_server.boto3_client()
    stale = client.put_object(Bucket=bucket, Key="state", Body=b"v1")["ETag"]
    current = client.put_object(Bucket=bucket, Key="state", Body=b"v2")["ETag"]
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=bucket, Key="state", Body=b"lost update", IfMatch=stale)
    assert _error(info) == ("PreconditionFailed", 412)
    assert client.get_object(Bucket=bucket, Key="state")["Body"].read() == b"v2"
    client.put_object(Bucket=bucket, Key="state", Body=b"v3", IfMatch=current)
    assert client.get_object(Bucket=bucket, Key="state")["Body"].read() == b"v3"
    with pytest.raises(ClientError) as info:  # as on S3: nothing to have matched
        client.put_object(Bucket=bucket, Key="no-such-key", Body=b"x", IfMatch=current)
    assert _error(info) == ("NoSuchKey", 404)


def test_objects_survive_a_sigkill_and_a_restart_on_the_same_endpoint(s3_server, bucket):
    client = s3_server.boto3_client()
    keys = {f"epoch={i}/part-0": f"rows of epoch {i}".encode() for i in range(5)}
    for key, body in keys.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    endpoint = s3_server.endpoint
    s3_server.kill()
    s3_server.start()
    assert s3_server.endpoint == endpoint
    client = s3_server.boto3_client()
    assert {key: client.get_object(Bucket=bucket, Key=key)["Body"].read()
            for key in keys} == keys
    assert sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]) == \
        sorted(keys)


def test_deltalake_commits_epochs_once_by_app_transaction_and_reads_them(s3_server, bucket):
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    uri = f"s3://{bucket}/t"
    options = s3_server.storage_options()

    def committed(app_id: str) -> int | None:
        try:
            return DeltaTable(uri, storage_options=options).transaction_version(app_id)
        except Exception:  # no table yet
            return None

    for epoch in (0, 1, 1):  # epoch 1 replayed, as after a crash between commit and ack
        done = committed("query-1")
        if done is not None and done >= epoch:
            continue
        rows = pa.table({"id": list(range(epoch * 10, epoch * 10 + 10))})
        write_deltalake(uri, rows, mode="append", storage_options=options,
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(app_id="query-1", version=epoch)]))
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    assert table.transaction_version("query-1") == 1
    assert table.transaction_version("another-query") is None
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(20))


def test_env_points_the_default_aws_credential_chain_at_the_server(s3_server, bucket,
                                                                  monkeypatch):
    import boto3

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE",
                 "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")  # nothing passed: all from the environment
    client.put_object(Bucket=bucket, Key="from-env", Body=b"ok")
    assert client.get_object(Bucket=bucket, Key="from-env")["Body"].read() == b"ok"


def test_missing_jars_fail_naming_the_installer_and_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(s3.JARS_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert s3.jars_dir() == tmp_path / "exactly" / "s3proxy" / "jars"
    with pytest.raises(ConfigError, match=r"run scripts/setup\.sh") as info:
        s3.s3proxy_jars_dir()
    assert s3.JARS_ENV in str(info.value)
    monkeypatch.setenv(s3.JARS_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=f"from {s3.JARS_ENV}"):
        s3.S3Server(tmp_path / "server").start()
