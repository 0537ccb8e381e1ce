"""The throw-away Iceberg REST catalog (exactly.testing.iceberg_rest) keeps the promises
Iceberg sinks are tested against, with its warehouse on local files and on S3: appends are
read back, snapshot summaries keep an epoch, a commit from a stale table is refused, it
listens on 127.0.0.1 only, and close() leaves no process behind.

The servers are the session fixtures ``iceberg_rest`` and ``iceberg_rest_s3``
(exactly.testing.pytest_plugin); each test uses a namespace of its own.
"""

from __future__ import annotations

import os
import uuid

import pytest

from exactly.errors import ConfigError
from exactly.testing import iceberg_rest as rest

pytestmark = pytest.mark.server

#: pyiceberg retries a failed append on the refreshed table (4 times by default), which would
#: hide the server's refusal: these tables let the first refusal through
NO_CLIENT_RETRIES = {"commit.retry.num-retries": "0"}


@pytest.fixture(params=["iceberg_rest", "iceberg_rest_s3"], ids=["local", "s3"])
def server(request) -> rest.IcebergRestServer:
    """The session's server with a local warehouse, then the one on S3."""
    return request.getfixturevalue(request.param)


def _catalog(server):
    from pyiceberg.catalog import load_catalog

    return load_catalog("rest", **server.catalog_properties())


def _schema():
    import pyarrow as pa

    return pa.schema([pa.field("id", pa.int64(), nullable=False), ("key", pa.string())])


def _rows(ids):
    import pyarrow as pa

    return pa.table({"id": pa.array(ids, pa.int64()), "key": [f"k{i}" for i in ids]},
                    schema=_schema())


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _new_table(server, **properties):
    catalog = _catalog(server)
    namespace = f"ns_{uuid.uuid4().hex[:10]}"
    catalog.create_namespace(namespace)
    return catalog.create_table(f"{namespace}.events", schema=_schema(),
                                properties=properties)


def test_two_appends_are_read_back_and_the_epoch_stays_in_the_snapshot_summary(server):
    table = _new_table(server)
    assert table.location().startswith(server.warehouse)
    table.append(_rows([1, 2, 3]), snapshot_properties={"exactly.epoch": "2"})
    table.append(_rows([4, 5]), snapshot_properties={"exactly.epoch": "3"})

    again = _catalog(server).load_table(table.name())  # a second client sees both commits
    assert sorted(again.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4, 5]
    assert again.current_snapshot().summary["exactly.epoch"] == "3"
    assert [s.summary["exactly.epoch"] for s in again.snapshots()] == ["2", "3"]


def test_a_commit_from_a_stale_table_is_refused_and_does_not_land(server):
    from pyiceberg.exceptions import CommitFailedException

    created = _new_table(server, **NO_CLIENT_RETRIES)
    first = _catalog(server).load_table(created.name())
    stale = _catalog(server).load_table(created.name())  # another client, same snapshot
    first.append(_rows([1]), snapshot_properties={"exactly.epoch": "1"})
    with pytest.raises(CommitFailedException):
        stale.append(_rows([2]), snapshot_properties={"exactly.epoch": "1"})

    now = _catalog(server).load_table(created.name())
    assert now.scan().to_arrow()["id"].to_pylist() == [1]
    assert len(now.snapshots()) == 1


def test_on_s3_metadata_and_data_files_are_objects_in_the_servers_bucket(iceberg_rest_s3,
                                                                         s3_server):
    table = _new_table(iceberg_rest_s3)
    table.append(_rows([1]))
    assert iceberg_rest_s3.warehouse == f"s3://{iceberg_rest_s3.bucket}/warehouse"
    prefix = table.location().removeprefix(f"s3://{iceberg_rest_s3.bucket}/")
    listed = s3_server.boto3_client().list_objects_v2(Bucket=iceberg_rest_s3.bucket,
                                                      Prefix=prefix)["Contents"]
    keys = [o["Key"] for o in listed]
    assert any(k.endswith(".metadata.json") for k in keys)  # written by the server
    assert any(k.endswith(".parquet") for k in keys)  # written by pyiceberg
    assert not (iceberg_rest_s3.workdir / "warehouse").exists()  # nothing local


def test_it_listens_on_127_0_0_1_only(iceberg_rest):
    import psutil

    listening = [c.laddr for c in psutil.Process(iceberg_rest.proc.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening, "the server listens on no socket"
    assert {(addr.ip.removeprefix("::ffff:"), addr.port) for addr in listening} == \
        {("127.0.0.1", iceberg_rest.port)}


def test_close_leaves_no_process_and_start_serves_the_same_tables_again(tmp_path):
    server = rest.IcebergRestServer(tmp_path / "rest")
    with server:
        pid, port = server.proc.pid, server.port
        table = _new_table(server)
        table.append(_rows([7]))
    assert server.proc is None
    assert not _alive(pid)
    with pytest.raises(ProcessLookupError):  # nor anything else in its process group
        os.killpg(pid, 0)
    with server:  # the same port, the same catalog.db and warehouse
        assert server.port == port
        again = _catalog(server).load_table(table.name())
        assert again.scan().to_arrow()["id"].to_pylist() == [7]
        again.append(_rows([8]))
        server.kill()  # SIGKILL: what was committed stays
        server.start()
        after_kill = _catalog(server).load_table(table.name())
        assert sorted(after_kill.scan().to_arrow()["id"].to_pylist()) == [7, 8]


def test_missing_jars_fail_naming_the_installer_and_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(rest.JARS_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert rest.jars_dir() == tmp_path / "exactly" / "iceberg-rest" / "jars"
    with pytest.raises(ConfigError, match=r"run scripts/setup\.sh s3") as info:
        rest.iceberg_rest_jars_dir()
    assert rest.JARS_ENV in str(info.value)
    monkeypatch.setenv(rest.JARS_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=f"from {rest.JARS_ENV}"):
        rest.IcebergRestServer(tmp_path / "server").start()
