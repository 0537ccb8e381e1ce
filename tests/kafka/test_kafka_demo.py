"""The Kafka demo's crash schedule and the sink's own fault point, without a broker."""

from __future__ import annotations

import random

import pytest

from exactly.connectors.kafka.publisher import IN_TRANSACTION
from exactly.demos.kafka import chaos_schedule
from exactly.protocol.faults import (
    DRIVER_POINTS,
    FaultPoint,
    FaultSpec,
    SimulatedCrash,
    fault_action,
    fault_from,
    maybe_crash,
    raise_simulated_crash,
    registered_points,
)


def test_the_chaos_schedule_covers_every_point_once_in_protocol_order():
    schedule = chaos_schedule(10, None, None)
    assert [s.point for s in schedule] == [*(p.value for p in DRIVER_POINTS), IN_TRANSACTION,
                                           FaultPoint.IN_WRITE.value]
    assert [s.min_epoch for s in schedule] == [1, 2, 3, 4, 5, 6, 7]


def test_a_random_schedule_fits_the_epochs():
    schedule = chaos_schedule(4, 10, random.Random(3))
    assert [s.min_epoch for s in schedule] == [1, 2, 3]


def test_in_transaction_is_a_registered_driver_point():
    info = registered_points()[IN_TRANSACTION]
    assert IN_TRANSACTION == "kafka.in_transaction"
    assert info.on_driver


def test_the_harness_arms_it_like_any_point(tmp_path):
    """The sink options the harness's flags become (``exactly.fault``,
    ``exactly.faultMarker``): it fires once, after ``before`` (the flush into the open
    transaction), and claims the marker."""
    marker = tmp_path / "fired.json"
    spec = fault_from(FaultSpec(IN_TRANSACTION, 2).with_marker(marker).options())
    flushed = []
    with fault_action(raise_simulated_crash):
        maybe_crash(spec, IN_TRANSACTION, 1, before=lambda: flushed.append(1))
        assert not flushed and not marker.exists()
        with pytest.raises(SimulatedCrash):
            maybe_crash(spec, IN_TRANSACTION, 2, before=lambda: flushed.append(2))
        assert flushed == [2] and marker.exists()
        maybe_crash(spec, IN_TRANSACTION, 3)  # once across restarts


def test_the_sink_reads_its_fault_from_its_options_never_from_the_environment(monkeypatch):
    from exactly.config import Mode
    from exactly.connectors.kafka.options import KafkaSinkOptions

    monkeypatch.setenv("EXACTLY_FAULT", "in_write@1")
    base = {"kafka.bootstrap.servers": "x:1", "topic": "t", "transactionalIdPrefix": "p"}
    assert KafkaSinkOptions.from_options(base, Mode.EXACTLY_ONCE).fault is None
    armed = KafkaSinkOptions.from_options({**base, "exactly.fault": f"{IN_TRANSACTION}@3"},
                                          Mode.EXACTLY_ONCE)
    assert armed.fault == FaultSpec(IN_TRANSACTION, 3)
