"""Scraping a Prometheus endpoint in tests (``exactly run --metrics-port``, ``exactly ui``)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, float] | None:
    """``{metric name: value}`` of the job-level samples ``http://host:port/metrics``
    serves (samples labelled with a ``part`` or an ``operator_name`` left out); None while
    it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples
            if not sample.labels.get("part") and not sample.labels.get("operator_name")}
