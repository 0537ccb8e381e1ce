"""The dashboard's chart library is committed and shipped in the package: the files are the
ones pinned in ``vendor/chart.js.pin`` (sha256 recorded by scripts/vendor-js.sh from the npm
release whose sha512 integrity it verified)."""

from __future__ import annotations

import hashlib
import json

from exactly.monitoring.server import VENDOR_CHART

VENDOR = VENDOR_CHART.parent


def test_the_vendored_chart_library_matches_its_pinned_version_and_sha256():
    pin = json.loads((VENDOR / "chart.js.pin").read_text())
    assert pin["package"] == "chart.js"
    assert set(pin["sha256"]) == {VENDOR_CHART.name, "chart.js.LICENSE.md"}
    for name, digest in pin["sha256"].items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    assert f"Chart.js v{pin['version']}\n" in VENDOR_CHART.read_text()[:200]
