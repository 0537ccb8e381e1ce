"""The Flink-named Prometheus metrics (exactly.monitoring.flink_metrics) on histories written
here by hand, without Spark: every value against the records the test wrote; uptime and
downtime while running, restarting and after the end; source lag; the ``exactly ui``
endpoint serving them beside its earlier names; the Grafana dashboard and the docs naming
only metrics the collector exposes."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exactly.checkpoint.history import HistoryStore, history_dir
from exactly.checkpoint.location import job_store
from exactly.checkpoint.restarts import RestartHistory
from exactly.errors import ConfigError
from exactly.monitoring import endpoint
from exactly.monitoring.flink_metrics import FlinkCollector, metric_names, pending_records
from exactly.monitoring.overview import load

ROOT = Path(__file__).parents[2]
J, T = "flink_jobmanager_job_", "flink_taskmanager_job_task_"
OP = "flink_taskmanager_job_task_operator_"
KAFKA = "KafkaV2[Subscribe[orders]]"


def _epoch(epoch: int, end: float, duration: float, new: int, full: int, rows: int,
           **extra) -> dict:
    return {"kind": "epoch", "at": end, "status": "completed", "epoch": epoch,
            "query_id": "q-1", "trigger_at": end - duration / 1000, "end_at": end,
            "duration_ms": duration, "rows_in": rows, "rows_out": rows - 1,
            "checkpoint": {"new_bytes": new, "full_bytes": full}, **extra}


def _run(at: float, resumed_after: int | None) -> dict:
    return {"kind": "run", "at": at, "query_id": "q-1", "name": "orders",
            "resumed_after_epoch": resumed_after, "config": {"interval_s": 1.0}}


@pytest.fixture
def base() -> float:
    return time.time() - 20  # recent: a job without a status file counts as running


@pytest.fixture
def checkpoint(tmp_path, base):
    """A running job: epochs 0 and 1, epoch 2 failed (a query failure, restarted), the
    query started again resuming after epoch 1, epochs 2 (replayed) and 3 completed."""
    ck = tmp_path / "ck"
    store = HistoryStore(history_dir(ck))
    for record in [
        _run(base, None),
        _epoch(0, base + 2, 900, 100, 1000, 50),
        _epoch(1, base + 4, 1500, 200, 1200, 60),
        {"kind": "epoch_failed", "at": base + 5, "query_id": "q-1", "epoch": 2,
         "failure": "query", "cause": "ValueError: bad row"},
        _run(base + 6, 1),
        _epoch(2, base + 7, 700, 300, 1500, 70),
        _epoch(3, base + 9, 2000, 400, 1900, 81, parts_ms={
            "processing": 1700.0, "sink_pre_commit": 3.5, "sink_commit": 12.25},
            sources=[{"description": KAFKA + "@4ac3388b", "rows": 81,
                      "end_offset": {"orders": {"0": 40, "1": 20}},
                      "latest_offset": {"orders": {"0": 45, "1": 27}},
                      "metrics": {"maxOffsetsBehindLatest": "7"}}]),
    ]:
        store.append(record)
    (job_store(ck).root / "restarts.jsonl").write_text(json.dumps(  # the query failure
        {"event": "failure", "run": "run-1", "at": base + 5, "kind": "query",
         "cause": "ValueError: bad row", "action": "restart", "delay": 1.0}) + "\n")
    return ck


def scrape(ck: Path, now: float) -> dict[tuple[str, tuple], float]:
    loaded = load(ck)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FlinkCollector(lambda: [(loaded.overview.job_id, loaded)],
                                     now=lambda: now))
    text = generate_latest(registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = dict(sample.labels)
            assert labels.pop("job_id") == "q-1" and labels.pop("job_name") == "orders"
            found[sample.name, tuple(sorted(labels.items()))] = sample.value
    return found


def test_every_value_comes_from_the_records_of_the_history(checkpoint, base):
    m = scrape(checkpoint, now=base + 30)
    assert m[J + "numberOfCompletedCheckpoints", ()] == 4
    assert m[J + "numberOfFailedCheckpoints", ()] == 1
    assert m[J + "numberOfInProgressCheckpoints", ()] == 0
    assert m[J + "totalNumberOfCheckpoints", ()] == 5
    assert m[J + "numRestarts", ()] == 1
    assert m[J + "lastCheckpointDuration", ()] == 2000
    assert m[J + "lastCheckpointSize", ()] == 400
    assert m[J + "lastCheckpointFullSize", ()] == 1900
    assert m[J + "lastCompletedCheckpointId", ()] == 3
    assert m[J + "lastCheckpointRestoreTimestamp", ()] == round((base + 6) * 1000)
    assert m[T + "numRecordsIn", ()] == 50 + 60 + 70 + 81
    assert m[T + "numRecordsOut", ()] == 49 + 59 + 69 + 80
    # the epochs that ended in the last 60 s, as Flink's meters
    assert m[T + "numRecordsInPerSecond", ()] == pytest.approx((50 + 60 + 70 + 81) / 60)
    assert m[T + "numRecordsOutPerSecond", ()] == pytest.approx((49 + 59 + 69 + 80) / 60)
    later = scrape(checkpoint, now=base + 65)  # epochs 0 and 1 (ended at +2, +4) fell out
    assert later[T + "numRecordsInPerSecond", ()] == pytest.approx((70 + 81) / 60)
    assert m["exactly_job_lastCheckpointSinkCommitDuration", ()] == 12.25
    assert m["exactly_job_lastCheckpointSinkPreCommitDuration", ()] == 3.5
    assert m["exactly_job_lastCheckpointPartDuration", (("part", "processing"),)] == 1700
    assert m["exactly_job_lastCheckpointRecordsIn", ()] == 81
    assert m["exactly_job_lastCheckpointRecordsOut", ()] == 80
    assert m["exactly_job_lastCheckpointCompletionTimestamp", ()] == round((base + 9) * 1000)
    assert m["exactly_job_numberOfRestoredCheckpoints", ()] == 1
    assert m[OP + "pendingRecords", (("operator_name", KAFKA),)] == 5 + 7
    assert m[OP + "KafkaSourceReader_KafkaConsumer_records_lag_max",
             (("operator_name", KAFKA),)] == 7
    # running since the query started again: up 24 s, no outage
    assert m[J + "uptime", ()] == 24_000 and m[J + "downtime", ()] == 0


def test_a_failure_after_the_last_start_is_downtime_and_an_ended_job_is_minus_one(
        checkpoint, base):
    history = RestartHistory(job_store(checkpoint), "run-1")
    entry = history.append("failure", kind="process", cause="ProcessFailure: killed",
                           action="restart", delay=5.0)
    m = scrape(checkpoint, now=entry["at"] + 3)
    assert m[J + "uptime", ()] == 0 and m[J + "downtime", ()] == 3000
    assert m[J + "numRestarts", ()] == 2
    HistoryStore(history_dir(checkpoint)).append(
        {"kind": "run_end", "at": time.time(), "query_id": "q-1", "outcome": "stopped"})
    m = scrape(checkpoint, now=time.time())
    assert m[J + "uptime", ()] == -1 and m[J + "downtime", ()] == -1


def test_a_job_without_a_completed_checkpoint_has_no_last_checkpoint_values(tmp_path):
    ck = tmp_path / "ck"
    HistoryStore(history_dir(ck)).append(_run(time.time(), None))
    m = scrape(ck, now=time.time())
    assert m[J + "numberOfCompletedCheckpoints", ()] == 0
    assert not any(name == J + "lastCheckpointDuration" for name, _ in m)


def test_pending_records_compares_latest_and_end_offsets_at_the_same_places():
    assert pending_records('{"t": {"0": 10, "1": 5}}', {"t": {"0": 4, "1": 5}}) == 6
    assert pending_records(120, 100) == 20
    assert pending_records(None, {"t": {"0": 4}}) is None
    assert pending_records({"t": {"0": 3}}, {"t": {"0": 4}}) == 0  # never negative


def test_the_run_endpoint_serves_the_checkpoint_it_watches_and_refuses_a_port_in_use(
        checkpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="the port is in use"):
            endpoint.start("127.0.0.1", taken.getsockname()[1])
    served = endpoint.start("127.0.0.1", 0)
    try:
        port = served.server.server_address[1]
        served.port = port
        before = urllib.request.urlopen(served.url, timeout=5).read().decode()
        assert "numberOfCompletedCheckpoints{" not in before  # no checkpoint yet: no job
        served.watch(str(checkpoint))
        after = urllib.request.urlopen(served.url, timeout=5).read().decode()
        assert (f'{J}numberOfCompletedCheckpoints{{job_id="q-1",job_name="orders"}} 4.0'
                in after)
    finally:
        served.close()


def test_exactly_ui_serves_flinks_names_beside_its_earlier_ones(checkpoint):
    from exactly.monitoring.server import Jobs, create_app

    app = create_app(Jobs([checkpoint]))
    route = next(r for r in app.routes if getattr(r, "path", None) == "/metrics")
    import asyncio

    response = asyncio.run(route.endpoint(None))  # type: ignore[attr-defined]
    text = response.body.decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"exactly_checkpoints", "exactly_last_checkpoint_duration_seconds",
            J + "numberOfCompletedCheckpoints", J + "lastCheckpointDuration"} <= names
    assert len(names) == len(list(text_string_to_metric_families(text)))  # no name twice


def _queried_metrics(dashboard: dict) -> set[str]:
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert exprs, "the dashboard queries nothing"
    return {name for expr in exprs
            for name in re.findall(r"\b(?:flink|exactly)_[A-Za-z0-9_]+", expr)}


def test_the_grafana_dashboard_queries_only_metrics_the_collector_exposes():
    dashboard = json.loads((ROOT / "docs" / "grafana" / "exactly.json").read_text())
    variables = dashboard["templating"]["list"]
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in variables)
    queried = _queried_metrics(dashboard)
    assert queried - metric_names() == set()
    for needed in (J + "lastCheckpointDuration", J + "lastCheckpointSize",
                   J + "numberOfCompletedCheckpoints", J + "numRestarts", J + "uptime",
                   J + "downtime", T + "numRecordsInPerSecond", OP + "pendingRecords",
                   "exactly_job_lastCheckpointSinkCommitDuration"):
        assert needed in queried, needed


def test_the_monitoring_doc_names_every_metric():
    text = (ROOT / "docs" / "monitoring.md").read_text()
    missing = [name for name in metric_names() if f"`{name}`" not in text]
    assert missing == []
