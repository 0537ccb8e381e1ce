"""Where a sink's commit log (and staging) may live: start_query's default beside the
checkpoint (local or s3a://), a local directory or an s3:// prefix for every exactly sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly import options as opt
from exactly.errors import ConfigError
from exactly.ops.query import with_sink_log_dir
from exactly.protocol.contract import SinkSettings


def test_the_log_follows_the_checkpoint_locally_and_on_s3():
    assert with_sink_log_dir("/ck", None)[opt.LOG_DIR] == "/ck/exactly-sink"
    assert with_sink_log_dir("s3a://lake/ck/", None)[opt.LOG_DIR] == "s3a://lake/ck/exactly-sink"
    assert with_sink_log_dir("s3a://lake/ck", {opt.LOG_DIR: "/mine"})[opt.LOG_DIR] == "/mine"


def test_the_log_location_is_a_path_or_an_s3_uri_and_the_stage_follows_it(tmp_path):
    from exactly.protocol.object_staging import ObjectStagingArea
    from exactly.protocol.stages import open_stage
    from exactly.protocol.staging import StagingArea

    settings = SinkSettings(log_dir="s3://lake/log")
    assert settings.require_log_location("exactly.kafka") == "s3://lake/log"
    assert SinkSettings(log_dir="file:///l").require_log_location("exactly.wal") == Path("/l")
    with pytest.raises(ConfigError, match=r"set option exactly\.logDir"):
        SinkSettings().require_log_location("exactly.wal")
    local = open_stage(f"file://{tmp_path}", "wal", "rows.parquet")
    assert isinstance(local, StagingArea) and local.base == tmp_path / "wal"
    remote = open_stage("s3a://lake/log", "staging", "rows.arrow")
    assert isinstance(remote, ObjectStagingArea)
    assert remote.base == "s3://lake/log/staging"
