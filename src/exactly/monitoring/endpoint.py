"""``exactly run --metrics-port``: the running job's Prometheus endpoint.

Served by the ``exactly run`` process itself (the launcher), not by a driver process: the
launcher lives for the whole run, so the endpoint keeps its address across driver restarts
(a scrape during a restart answers, with ``downtime`` counting), and its values come from
the checkpoint (:mod:`exactly.monitoring.flink_metrics`), which every driver writes to.

The socket is bound by :func:`start` before anything else starts (no Spark, no claim of the
checkpoint): a port in use fails the command at once with a ConfigError naming the fix.
Reads of the checkpoint are cached for half a second; a checkpoint not yet readable (a job
whose first driver has not started) answers with no job metrics, not an error.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from exactly.errors import ConfigError
from exactly.logs import log_event
from exactly.monitoring.flink_metrics import FlinkCollector
from exactly.monitoring.overview import Loaded, load

logger = logging.getLogger("exactly.monitoring")

#: the default address: metrics stay on this machine unless --metrics-host widens it
DEFAULT_HOST = "127.0.0.1"
_CACHE_S = 0.5


@dataclass
class WatchedCheckpoint:
    """The overview of one checkpoint, read again at most every half second; empty until
    :attr:`checkpoint` is set and readable."""

    checkpoint: str | None = None
    _loaded: Loaded | None = None
    _at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def jobs(self) -> list[tuple[str, Loaded]]:
        with self._lock:
            if self.checkpoint is None:
                return []
            if self._loaded is None or time.monotonic() - self._at > _CACHE_S:
                try:
                    self._loaded = load(self.checkpoint)
                except ConfigError:
                    pass  # not a checkpoint yet: keep the last read (or none)
                except Exception as exc:  # a store error: log it, answer what was read last
                    log_event(logger, "metrics_read_failed", logging.WARNING,
                              error=type(exc).__name__, detail=str(exc)[:300])
                self._at = time.monotonic()
            if self._loaded is None:
                return []
            return [(self._loaded.overview.job_id, self._loaded)]


@dataclass
class MetricsEndpoint:
    """A listening ``/metrics`` endpoint; :meth:`close` stops it."""

    host: str
    port: int
    watched: WatchedCheckpoint
    server: WSGIServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def watch(self, checkpoint: str) -> None:
        """Serve the metrics of ``checkpoint`` (a path or an s3a:// URI) from now on."""
        self.watched.checkpoint = checkpoint

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start(host: str, port: int, checkpoint: str | None = None) -> MetricsEndpoint:
    """Listen on ``host:port`` at once (prometheus_client's HTTP server in a daemon thread)
    and serve the metrics of ``checkpoint`` (or of the one :meth:`MetricsEndpoint.watch`
    names later). Raises ConfigError when the address cannot be bound."""
    watched = WatchedCheckpoint(checkpoint)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FlinkCollector(watched.jobs))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"--metrics-port {port}: the port is in use on {host}; pick a "
                              "free one (Flink's Prometheus reporter uses 9249)") from None
        raise ConfigError(f"--metrics-port {port}: cannot listen on {host}:{port} "
                          f"({exc.strerror or exc}); check --metrics-host and the port") \
            from None
    log_event(logger, "metrics_endpoint", host=host, port=port)
    return MetricsEndpoint(host, port, watched, server, thread)
