"""``exactly ui``: the checkpoint dashboard, a REST API modelled on Flink's, Prometheus metrics.

One server (Starlette on uvicorn, bound to 127.0.0.1) for one or several checkpoint
directories. Everything it shows is read from the checkpoints on each request (cached for
half a second), so it follows a running job and keeps working after the job stopped, like
Flink's history server.

REST paths (JSON)::

    /jobs                                      the jobs: id, name, status, checkpoint, counts
    /jobs/<id>/checkpoints                     counts, latest, summary, history, restarts;
                                               leader and failovers (``exactly run --ha``)
    /jobs/<id>/checkpoints/details/<epoch>     everything recorded about one epoch
    /jobs/<id>/checkpoints/config              the checkpoint configuration
    /metrics                                   Prometheus text format: Flink's names
                                               (exactly.monitoring.flink_metrics, as
                                               ``exactly run --metrics-port`` serves them)
                                               and the earlier exactly_* gauges

A job's id is its streaming query's id (stable across restarts). Unknown jobs and epochs
answer 404 with ``{"errors": [...]}``, as Flink's REST API does.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from exactly.checkpoint.location import checkpoint_uri
from exactly.errors import ConfigError
from exactly.monitoring.flink_metrics import FlinkCollector
from exactly.monitoring.overview import Loaded, load

STATIC = Path(__file__).with_name("static")
VENDOR_CHART = STATIC / "vendor" / "chart.umd.min.js"
#: Flink's web UI port
DEFAULT_PORT = 8081
_CACHE_S = 0.5


@dataclass
class _Job:
    checkpoint: str  #: a local path or an s3a:// URI (exactly.checkpoint.location)
    loaded: Loaded | None = None
    loaded_at: float = 0.0
    error: str | None = None


class Jobs:
    """The checkpoints a server shows, read again at most every half second."""

    def __init__(self, checkpoints: Sequence[str | Path]) -> None:
        if not checkpoints:
            raise ConfigError("exactly ui: give at least one checkpoint (a directory or an "
                              "s3a:// URI)")
        self._jobs = [_Job(checkpoint_uri(c)) for c in checkpoints]
        self._lock = threading.Lock()
        for job in self._jobs:  # a directory that is not a checkpoint fails the start
            job.loaded = load(job.checkpoint)
            job.loaded_at = time.monotonic()

    def all(self) -> list[tuple[str, Loaded]]:
        """``(id, loaded)`` per checkpoint, ids made unique (a copied checkpoint keeps its
        query id: the second gets ``-2``)."""
        found: list[tuple[str, Loaded]] = []
        seen: dict[str, int] = {}
        for job in self._jobs:
            loaded = self._fresh(job)
            base = loaded.overview.job_id
            seen[base] = seen.get(base, 0) + 1
            found.append((base if seen[base] == 1 else f"{base}-{seen[base]}", loaded))
        return found

    def get(self, job_id: str) -> Loaded | None:
        return next((loaded for jid, loaded in self.all() if jid == job_id), None)

    def _fresh(self, job: _Job) -> Loaded:
        with self._lock:
            if job.loaded is None or time.monotonic() - job.loaded_at > _CACHE_S:
                try:
                    job.loaded = load(job.checkpoint)
                    job.error = None
                except ConfigError as exc:  # deleted meanwhile: keep showing the last read
                    job.error = str(exc)
                    if job.loaded is None:
                        raise
                job.loaded_at = time.monotonic()
            assert job.loaded is not None
            warnings = job.loaded.overview.warnings
            if job.error and job.error not in warnings:
                warnings.append(job.error)
            return job.loaded


def _not_found(message: str) -> JSONResponse:
    return JSONResponse({"errors": [message]}, status_code=404)


def create_app(jobs: Jobs) -> Starlette:
    """The Starlette application serving ``jobs``."""

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def list_jobs(request: Request) -> Response:
        return JSONResponse({"jobs": [
            {"id": jid, "name": loaded.overview.name, "status": loaded.overview.status,
             "status_detail": loaded.overview.status_detail,
             "checkpoint": loaded.overview.checkpoint, "counts": loaded.overview.counts,
             "last_epoch": (loaded.overview.latest.get("completed") or {}).get("epoch")}
            for jid, loaded in jobs.all()]})

    async def checkpoints(request: Request) -> Response:
        loaded = jobs.get(request.path_params["job_id"])
        if loaded is None:
            return _not_found(f"no job {request.path_params['job_id']!r}; see /jobs")
        data = loaded.overview.to_json()
        data.pop("config", None)
        return JSONResponse(data)

    async def details(request: Request) -> Response:
        loaded = jobs.get(request.path_params["job_id"])
        if loaded is None:
            return _not_found(f"no job {request.path_params['job_id']!r}; see /jobs")
        epoch = request.path_params["epoch"]
        found = loaded.details(epoch)
        if found is None:
            return _not_found(f"epoch {epoch} is not in the history of job "
                              f"{request.path_params['job_id']}")
        return JSONResponse(found)

    async def config(request: Request) -> Response:
        loaded = jobs.get(request.path_params["job_id"])
        if loaded is None:
            return _not_found(f"no job {request.path_params['job_id']!r}; see /jobs")
        return JSONResponse(loaded.overview.config)

    async def metrics(request: Request) -> Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(jobs))
        registry.register(FlinkCollector(jobs.all))
        return Response(generate_latest(registry),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = [
        Route("/", index),
        Route("/jobs", list_jobs),
        Route("/jobs/{job_id}/checkpoints", checkpoints),
        Route("/jobs/{job_id}/checkpoints/config", config),
        Route("/jobs/{job_id}/checkpoints/details/{epoch:int}", details),
        Route("/metrics", metrics),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes)


#: per-job gauges: key -> (metric name, help text)
_METRICS = {
    "restored": ("exactly_checkpoints_restored", "Restores from a checkpoint or savepoint"),
    "restarts": ("exactly_job_restarts", "Restarts after failures"),
    "up": ("exactly_job_running", "1 while the job runs"),
    "spare": ("exactly_spare_driver_ready",
              "1 while a warm spare driver is ready to take the job over (exactly run)"),
    "epoch": ("exactly_last_checkpoint_epoch", "Epoch of the latest completed checkpoint"),
    "duration": ("exactly_last_checkpoint_duration_seconds",
                 "End-to-end duration of the latest completed checkpoint"),
    "full": ("exactly_last_checkpoint_size_bytes",
             "Full checkpoint size on disk after the latest completed checkpoint"),
    "new": ("exactly_last_checkpoint_new_bytes", "Bytes the latest completed checkpoint added"),
    "rows": ("exactly_last_checkpoint_rows", "Input rows of the latest completed checkpoint"),
    "age": ("exactly_last_checkpoint_end_timestamp_seconds",
            "When the latest completed checkpoint ended (Unix time)"),
}


class _Collector:
    """Prometheus metrics of every job, computed at scrape time."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs

    def collect(self) -> Iterable[GaugeMetricFamily]:
        labels = ["job", "checkpoint"]
        families = {key: GaugeMetricFamily(name, text, labels=labels)
                    for key, (name, text) in _METRICS.items()}
        families["checkpoints"] = GaugeMetricFamily(
            "exactly_checkpoints", "Checkpoints (epochs) by status since the history began",
            labels=[*labels, "status"])
        for jid, loaded in self.jobs.all():
            view = loaded.overview
            values = [jid, view.checkpoint]
            for status in ("completed", "failed", "in_progress"):
                families["checkpoints"].add_metric([*values, status], view.counts[status])
            families["restored"].add_metric(values, view.counts["restored"])
            families["restarts"].add_metric(values, view.counts["restarts"])
            families["up"].add_metric(values, 1.0 if view.status == "running" else 0.0)
            ready = view.spare is not None and view.spare["state"] == "ready"
            families["spare"].add_metric(values, 1.0 if ready else 0.0)
            latest = view.latest.get("completed")
            if latest:
                families["epoch"].add_metric(values, latest["epoch"])
                for key, name, scale in (("duration_ms", "duration", 1000.0),
                                         ("full_bytes", "full", 1.0),
                                         ("new_bytes", "new", 1.0),
                                         ("rows_in", "rows", 1.0),
                                         ("end_at", "age", 1.0)):
                    if latest.get(key) is not None:
                        families[name].add_metric(values, latest[key] / scale)
        yield from families.values()


def check_port_free(host: str, port: int) -> None:
    """Raise ConfigError naming the fix when ``host:port`` cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is in use (another `exactly ui`, "
                                  "or Flink's web UI); pick a free one with --port") from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; pick "
                              "another port with --port") from None


def check_assets() -> None:
    if not VENDOR_CHART.is_file():
        raise ConfigError(f"the dashboard's chart library is missing ({VENDOR_CHART}): it "
                          "ships in exactly's wheel and checkout; reinstall exactly (pip "
                          "install --force-reinstall exactly), or in a checkout restore it "
                          "with `git checkout src/exactly/monitoring/static/vendor` (maintainers"
                          ": scripts/vendor-js.sh re-vendors it)")


def serve(checkpoints: Sequence[str | Path], *, host: str = "127.0.0.1",
          port: int = DEFAULT_PORT, ready: Any = None) -> None:
    """Serve the dashboard until interrupted. ``ready(url)`` is called once it listens."""
    import uvicorn

    jobs = Jobs(checkpoints)
    check_assets()
    check_port_free(host, port)
    config = uvicorn.Config(create_app(jobs), host=host, port=port, log_level="warning",
                            access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    if ready is not None:
        def announce() -> None:
            while not server.started and not server.should_exit:
                time.sleep(0.05)
            if server.started:
                ready(f"http://{host}:{port}/")
        threading.Thread(target=announce, daemon=True).start()
    server.run()
