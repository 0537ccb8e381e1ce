"""What the Kafka connectors ask the broker itself, and which of its errors pass in a moment.

* :func:`is_transient` - the one classification of Kafka errors worth retrying for calls
  that may simply be made again (reads of offsets and configs, the source's fetches).
* :func:`broker_transaction_max_timeout_ms` - the broker's ``transaction.max.timeout.ms``,
  which the sink's start check compares its transaction timeout with. Spark asks the data
  source for its stream writer before every epoch, in the planner worker and again in the
  commit worker, so the answer is kept per process and bootstrap list: a broker is asked
  once per Python worker, not twice an epoch, and a broker restarting between epochs does
  not fail the epoch's check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from exactly import options as opt
from exactly.connectors.kafka.options import KafkaSinkError
from exactly.retry import retry_call

logger = logging.getLogger("exactly.kafka")

#: how long the writer's check (before every epoch) waits for a broker down or restarting
BROKER_CHECK_SECONDS = 60.0
#: how long the check before a query starts waits: a wrong bootstrap list fails soon
START_CHECK_SECONDS = 10.0

_max_timeouts: dict[str, int] = {}
_lock = threading.Lock()


def is_transient(exc: BaseException) -> bool:
    """True for a Kafka error that may pass in a moment: the client flags it retriable, the
    broker is unreachable, or a partition has no leader yet (a broker restarting)."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    err = exc.args[0]
    if not isinstance(err, KafkaError):
        return False
    return bool(err.retriable()) or err.code() in (
        KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
        KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION)


def broker_transaction_max_timeout_ms(conf: Mapping[str, Any],
                                      seconds: float = BROKER_CHECK_SECONDS) -> int:
    """The broker's ``transaction.max.timeout.ms`` (AdminClient ``describe_configs``).

    Asked once per process and ``bootstrap.servers``; transient errors (a broker down or
    restarting) are retried for ``seconds``, then KafkaSinkError names the bootstrap
    option to check.
    """
    bootstrap = str(conf.get("bootstrap.servers"))
    with _lock:
        known = _max_timeouts.get(bootstrap)
    if known is not None:
        return known
    try:
        value = retry_call(lambda: _ask(conf, seconds), what="read broker config",
                           transient=is_transient, seconds=seconds, log=logger,
                           bootstrap=bootstrap)
    except Exception as exc:
        raise KafkaSinkError(f"cannot reach Kafka at {bootstrap}: {exc}. "
                             f"Check {opt.KAFKA_BOOTSTRAP} and that the broker is up") from exc
    with _lock:
        _max_timeouts[bootstrap] = value
    return value


def _ask(conf: Mapping[str, Any], seconds: float) -> int:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(dict(conf))
    brokers = admin.list_topics(timeout=seconds).brokers  # transient errors are retried
    if not brokers:
        raise ValueError("the cluster lists no brokers")
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER,
                                                     str(min(brokers)))])
    (config,) = [f.result(seconds) for f in futures.values()]
    return int(config["transaction.max.timeout.ms"].value)


def forget_broker_answers() -> None:
    """Drop the answers this process keeps (the next check asks the brokers again)."""
    with _lock:
        _max_timeouts.clear()
