"""The Kafka tests' broker: ``broker`` (a real single-node broker, KRaft, 127.0.0.1, started
once per session), ``kafka_jars``, ``topic`` (a fresh 2-partition topic) and ``kafka_proxy``
(the nemesis proxy in front of the broker's proxied listener) come from the plugin
:mod:`exactly.testing.pytest_plugin`, registered in tests/conftest.py.

The broker jars come from scripts/install-kafka.sh (called by scripts/setup.sh). When they
are missing the tests FAIL with that instruction: a Kafka test that silently skips proves
nothing.
"""
