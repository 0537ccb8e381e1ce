"""``exactly.kafka.publishShares``: parsed and checked before a query starts; each share
has a transactional id and a marker group of its own, share 1 of one query never another
query's; pre-commits record the count; the handles of an epoch are split by partition."""

from __future__ import annotations

import pytest

from exactly.config import Mode
from exactly.connectors.kafka.options import KafkaSinkOptions
from exactly.connectors.kafka.shares import KafkaPayload, epoch_shares, split
from exactly.errors import ConfigError
from exactly.protocol.contract import Handle, TaskInfo

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t",
        "transactionalIdPrefix": "app"}


def parsed(**extra: str) -> KafkaSinkOptions:
    return KafkaSinkOptions.from_options({**BASE, **extra}, Mode.EXACTLY_ONCE)


def test_one_share_by_default_and_a_count_within_bounds_is_taken():
    assert parsed().publish_shares == 1
    assert parsed(**{"exactly.kafka.publishShares": " 4 "}).publish_shares == 4


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5", "257", ""])
def test_a_share_count_out_of_bounds_is_refused_naming_the_option_and_the_range(bad):
    with pytest.raises(ConfigError, match=r"exactly\.kafka\.publishShares.*1 .*256"):
        parsed(**{"exactly.kafka.publishShares": bad})


def test_each_share_has_its_own_transactional_id_and_marker_group():
    o = parsed()
    assert o.transactional_id("q") == "app-q" and o.marker_group("q") == "app-q-epochs"
    assert o.transactional_id("q", 0) == "app-q-0" and o.marker_group("q", 1) == \
        "app-q-epochs-1"
    # a query id ending in -1 with share None never meets share 1 of query "q"
    assert o.transactional_id("q-1") == "app-q-1"
    assert o.marker_group("q-1") != o.marker_group("q", 1)


def handle(partition: int, shares: int) -> Handle:
    return Handle(TaskInfo("q", "r", 3, partition, 0),
                  KafkaPayload(rows=1, dir=f"d{partition}", file="rows.arrow", shares=shares))


def test_an_epoch_is_published_in_the_share_count_its_pre_commits_recorded():
    assert epoch_shares([handle(0, 3), handle(1, 3)], default=2) == 3
    assert epoch_shares([], default=2) == 2
    old = Handle.from_json({"query_id": "q", "run_id": "r", "epoch": 0, "partition": 0,
                            "attempt": 0, "payload": {"rows": 1, "dir": "d", "file": "f"}},
                           KafkaPayload)
    assert epoch_shares([old], default=4) == 1  # an intent of a run before shares


def test_the_handles_of_an_epoch_are_split_by_partition_modulo_the_shares():
    parts = split([handle(p, 3) for p in (4, 0, 2, 1, 3)], 3)
    assert [[h.partition for h in part] for part in parts] == [[0, 3], [1, 4], [2]]
    assert [len(part) for part in split([handle(0, 4)], 4)] == [1, 0, 0, 0]
