"""Spark settings for checkpoints on s3a:// (exactly.spark.s3a): the jars (Maven coordinates,
or an offline directory on the class path) and fs.s3a.* from the AWS_* variables, with the
mistakes refused in one line."""

from __future__ import annotations

import pyspark
import pytest

from exactly.errors import ConfigError
from exactly.spark import s3a


@pytest.fixture
def jars(tmp_path, monkeypatch):
    (tmp_path / "hadoop-aws-3.5.0.jar").write_bytes(b"")
    monkeypatch.setenv(s3a.JARS_ENV, str(tmp_path))
    return tmp_path


def test_an_endpoint_and_keys_become_path_style_s3a_settings_with_the_jars_on_the_class_path(
        jars):
    conf = s3a.s3a_conf({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
                         "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "id",
                         "AWS_SECRET_ACCESS_KEY": "secret"})
    assert conf["spark.driver.extraClassPath"] == f"{jars}/*"
    assert conf["spark.executor.extraClassPath"] == f"{jars}/*"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "SimpleAWSCredentialsProvider")
    # the executors' Python (staged files, Delta files) reaches the same store
    assert conf["spark.executorEnv.AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert conf["spark.executorEnv.AWS_ALLOW_HTTP"] == "true"
    assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == "secret"


def test_without_keys_s3a_keeps_its_default_credential_chain(jars):
    conf = s3a.s3a_conf({})
    assert not any("credentials" in key or "access.key" in key for key in conf)


def test_a_plain_http_endpoint_needs_an_explicit_allowance(jars):
    with pytest.raises(ConfigError, match="AWS_ALLOW_HTTP=true"):
        s3a.s3a_conf({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})


def test_missing_jars_name_the_download_command_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(s3a.JARS_ENV, str(tmp_path / "none"))
    with pytest.raises(ConfigError, match=r"exactly packages --s3a --download") as error:
        s3a.jars_dir()
    assert "EXACTLY_S3A_JARS" in str(error.value)


def test_without_the_offline_directory_spark_resolves_s3a_from_maven_central(tmp_path,
                                                                             monkeypatch):
    monkeypatch.delenv(s3a.JARS_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    conf = s3a.s3a_conf({})
    assert "spark.driver.extraClassPath" not in conf
    assert conf["spark.jars.packages"].split(",") == list(
        s3a.S3A_PACKAGES[pyspark.__version__].coordinates)
    assert "software.amazon.awssdk:bundle" in conf["spark.jars.excludes"].split(",")
