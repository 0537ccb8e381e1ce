"""The ``case`` fixture: one sink of the contract suite (see sink_cases.py), built fresh per
test. Scenarios choose their sinks with ``sink_cases.over_sinks``."""

from __future__ import annotations

from pathlib import Path

import pytest
from sink_cases import BY_NAME, SinkCase


@pytest.fixture
def case(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    return BY_NAME[request.param](request, tmp_path)
