"""Mapping a savepoint's source positions onto a restored job's sources by uid (no Spark)."""

from __future__ import annotations

import pytest

from exactly.errors import SavepointError
from exactly.savepoints.sources import (
    NO_OFFSET,
    SourceRef,
    map_sources,
    remap_offsets,
    saved_sources,
)

DG = "exactly.datagen"


def refs(*items: tuple[str | None, str | None]) -> list[SourceRef]:
    return [SourceRef(i, fmt, uid) for i, (fmt, uid) in enumerate(items)]


def entry(*offsets: str) -> str:
    return "\n".join(["v1", '{"batchWatermarkMs":0}', *offsets])


def test_unnamed_sources_keep_their_numbers_as_before():
    saved = saved_sources([{"index": 0, "offset": "{}"}, {"index": 1, "offset": "{}"}],
                          [DG, "kafka"])
    found = map_sources(saved, refs((DG, None), ("kafka", None)))
    assert found.resumed_from == [0, 1] and found.identity
    assert remap_offsets(entry("a", "b"), found) == entry("a", "b")


def test_a_new_named_source_gets_no_offset_and_the_old_one_keeps_its_line():
    found = map_sources(refs((DG, "a")), refs((DG, "a"), (DG, "b")))
    assert found.resumed_from == [0, None] and [s.uid for s in found.new] == ["b"]
    assert remap_offsets(entry('{"rows": 100}'), found) == entry('{"rows": 100}', NO_OFFSET)


def test_reordered_sources_keep_their_positions():
    found = map_sources(refs((DG, "a"), ("kafka", "b")), refs(("kafka", "b"), (DG, "a")))
    assert found.resumed_from == [1, 0] and not found.identity
    assert remap_offsets(entry("A", "B"), found) == entry("B", "A")


def test_a_savepoint_without_uids_restores_into_a_job_that_names_its_sources():
    found = map_sources(refs((DG, None)), refs((DG, "a"), (DG, "b")))
    assert found.resumed_from == [0, None]


def test_a_removed_source_is_refused_naming_its_uid_unless_allowed():
    saved, job = refs((DG, "a"), (DG, "b")), refs((DG, "b"))
    with pytest.raises(SavepointError, match=r"'a'.*--allow-non-restored-state"):
        map_sources(saved, job)
    found = map_sources(saved, job, allow_non_restored_state=True)
    assert found.resumed_from == [1] and [s.uid for s in found.dropped] == ["a"]
    assert remap_offsets(entry("A", "B"), found) == entry("B")


def test_a_uid_given_twice_is_refused():
    with pytest.raises(SavepointError, match="'a' is given to more than one source"):
        map_sources(refs((DG, "a")), refs((DG, "a"), (DG, "a")))


def test_a_uid_that_now_names_another_format_is_refused():
    with pytest.raises(SavepointError, match=r"'a' read exactly.datagen .* reads kafka"):
        map_sources(refs((DG, "a")), refs(("kafka", "a")))


def test_an_unnamed_extra_or_other_source_is_another_jobs_savepoint():
    with pytest.raises(SavepointError, match="another job"):
        map_sources(refs((DG, None)), refs((DG, None), (DG, None)))
    with pytest.raises(SavepointError, match="another job"):
        map_sources(refs((DG, None)), refs(("kafka", None)))


def test_an_entry_with_another_number_of_sources_is_a_damaged_savepoint():
    found = map_sources(refs((DG, "a")), refs((DG, "b"), (DG, "a")))
    with pytest.raises(SavepointError, match="damaged"):
        remap_offsets(entry("A", "B"), found)


def test_the_sink_sees_a_restored_epoch_whose_sources_moved_as_the_same_epoch():
    from exactly.checkpoint.spark_files import EpochInput
    from exactly.protocol.epoch_identity import _reordered_by_restore

    recorded = EpochInput.of(4, [{"rows": 800}, {"rows": 50}]).to_json()
    moved = EpochInput.of(4, [{"rows": 50}, None, {"rows": 800}]).to_json()
    order = [1, None, 0]
    assert _reordered_by_restore(recorded, moved, 4, (4, order))
    assert not _reordered_by_restore(recorded, moved, 5, (4, order))  # after the restore
    assert not _reordered_by_restore(recorded, moved, 4, None)  # no restore recorded
    replanned = EpochInput.of(4, [{"rows": 60}, None, {"rows": 800}]).to_json()
    assert not _reordered_by_restore(recorded, replanned, 4, (4, order))
