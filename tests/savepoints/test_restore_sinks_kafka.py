"""Savepoints and the Kafka sink: an upgrade into the same topic takes it over (the old
query's transactional producer fenced) and the topic holds every id once for read_committed
readers; a rollback into it is refused, since committed records cannot be taken back. Real
Spark, a real Kafka broker."""

from __future__ import annotations

import numpy as np
import pytest
from savepoint_jobs import StatefulJob

from exactly.audit import audit_ids, json_ids
from exactly.errors import SavepointError
from exactly.savepoints.sinks import SinkRollback
from exactly.testing.kafka_broker import consume_all

pytestmark = pytest.mark.server

STEP = 1000


def topic_ids(broker, topic) -> np.ndarray:
    return json_ids(v for _, _, _, v in consume_all(broker.bootstrap, topic))


# CI budget: the Kafka sink's hand-over and refused rollback are proven without Spark in
# test_rollback_lineage.py (case kafka); this job end to end in the slow lane
@pytest.mark.slow
def test_an_upgrade_takes_the_topic_over_and_a_rollback_is_refused(spark, broker, topic,
                                                                  tmp_path, savepoints):
    env = {"JOB_KIND": "tws", "JOB_BACKEND": "rocksdb", "JOB_SINK": "kafka",
           "JOB_BOOTSTRAP": broker.bootstrap, "JOB_TOPIC": topic}
    first = StatefulJob(spark, tmp_path / "ck0", **env)
    first.run(STEP)
    sp = first.savepoint(savepoints)
    second = StatefulJob(spark, tmp_path / "ck1", **env)
    done = second.restore(sp, 2 * STEP)
    assert done["fenced"][0].startswith(f"sp-{topic}-")
    second.run(2 * STEP)
    report = audit_ids(topic_ids(broker, topic), np.arange(2 * STEP))
    assert report.ok, report.to_json()

    third = StatefulJob(spark, tmp_path / "ck2", **env)
    later = second.savepoint(savepoints)
    second.run(3 * STEP)  # the topic moves past `later`
    with pytest.raises(SavepointError, match=r"newer than the savepoint.*--sink-rollback keep"):
        third.restore(later, 4 * STEP)
    with pytest.raises(SavepointError, match="cannot be taken back"):
        third.restore(later, 4 * STEP, sink_rollback=SinkRollback.RETRACT)
    report = audit_ids(topic_ids(broker, topic), np.arange(3 * STEP))
    assert report.ok, report.to_json()
