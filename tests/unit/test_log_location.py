"""Where a sink's commit log may live: start_query's default beside the checkpoint (local
or s3a://), an s3:// prefix for sinks without shared staging files, refused for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly import options as opt
from exactly.errors import ConfigError
from exactly.protocol.contract import SinkSettings
from exactly.spark.runner import with_sink_log_dir


def test_the_log_follows_the_checkpoint_locally_and_on_s3():
    assert with_sink_log_dir("/ck", None)[opt.LOG_DIR] == "/ck/exactly-sink"
    assert with_sink_log_dir("s3a://lake/ck/", None)[opt.LOG_DIR] == "s3a://lake/ck/exactly-sink"
    assert with_sink_log_dir("s3a://lake/ck", {opt.LOG_DIR: "/mine"})[opt.LOG_DIR] == "/mine"


def test_sinks_that_stage_files_in_their_log_refuse_one_on_object_storage():
    settings = SinkSettings(log_dir="s3://lake/log")
    assert settings.require_log_location("exactly.delta") == "s3://lake/log"
    with pytest.raises(ConfigError, match="needs a POSIX directory"):
        settings.require_log_dir("exactly.kafka")
    assert SinkSettings(log_dir="file:///l").require_log_dir("exactly.wal") == Path("/l")
