"""Spark Connect sessions refused before any connection: what a client cannot change on a
server (its master, its jars), a URL that is not ``sc://``; and the client's retries bounded
(PySpark's own wait at least 10 minutes for a server that went away)."""

from __future__ import annotations

import pytest

from exactly.errors import ConfigError
from exactly.spark.connect import REMOTE_ENV, RETRY_SECONDS, remote_url, retry_policy
from exactly.spark.session import spark_session

#: nothing listens here: a refusal must come before any connection attempt
NOWHERE = "sc://127.0.0.1:9"


def test_the_remote_comes_from_the_argument_then_spark_remote(monkeypatch):
    monkeypatch.delenv(REMOTE_ENV, raising=False)
    assert remote_url() is None
    monkeypatch.setenv(REMOTE_ENV, "sc://127.0.0.1:15002")
    assert remote_url() == "sc://127.0.0.1:15002"
    assert remote_url("sc://10.0.0.1:15002") == "sc://10.0.0.1:15002"


def test_a_remote_that_is_not_sc_is_refused_naming_the_form(monkeypatch):
    monkeypatch.delenv(REMOTE_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"sc://127\.0\.0\.1:15002"):
        remote_url("http://127.0.0.1:15002")


@pytest.mark.parametrize("kwargs, named", [
    ({"master": "local[2]"}, "master"),
    ({"kafka": True}, "Kafka connector"),
    ({"s3a": True}, "S3A"),
])
def test_what_the_server_fixed_at_its_start_is_refused_before_connecting(kwargs, named):
    with pytest.raises(ConfigError, match="does not work on a Spark Connect session") as err:
        spark_session(remote=NOWHERE, **kwargs)
    assert named in str(err.value)


def test_the_clients_retries_wait_about_the_bound_not_ten_minutes():
    policy = retry_policy()
    waits, backoff = [], float(policy.initial_backoff)
    for _ in range(policy.max_retries):
        waits.append(min(backoff, policy.max_backoff))
        backoff *= policy.backoff_multiplier
    total = sum(waits) / 1000
    assert RETRY_SECONDS <= total <= RETRY_SECONDS + policy.max_backoff / 1000
