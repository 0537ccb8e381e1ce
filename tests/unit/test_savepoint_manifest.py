"""The savepoint manifest: complete savepoints read back, and every kind of damage (an
interrupted savepoint, a truncated or non-JSON manifest, a manifest of the future, a foreign
directory, a missing or altered file) fails with an error that names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exactly.errors import SavepointError
from exactly.savepoints.manifest import (
    FORMAT_VERSION,
    Manifest,
    OperatorInfo,
    SinkInfo,
    StoreInfo,
    dispose,
    incomplete_savepoints,
    inprogress_dir,
    publish,
    read_manifest,
    write_manifest,
)


def manifest(**changes) -> Manifest:
    values = dict(savepoint_id="abc", epoch=7, created_at="2026-11-26T00:00:00Z",
                  query_id="q-1", trigger="stop", spark_version="4.3.0",
                  shuffle_partitions=2, state_backend="hashmap", sql_conf={},
                  sources=[{"index": 0, "offset": {"rows": 10}}],
                  operators=[OperatorInfo(0, "stateStoreSave", 2, "counts",
                                          [StoreInfo("default", "{}", "{}", 10, 100)])],
                  sinks=[SinkInfo("exactly.files", "/out", 7)], job={})
    values.update(changes)
    return Manifest(**values)


def make_savepoint(target: Path) -> Path:
    work = inprogress_dir(target, 7, "abc")
    (work / "checkpoint" / "offsets").mkdir(parents=True)
    (work / "checkpoint" / "offsets" / "7").write_text("v1\n{}\n{\"rows\": 10}")
    (work / "checkpoint" / "metadata").write_text('{"id": "q-1"}\n')
    write_manifest(work, manifest())
    return publish(work)


def test_a_complete_savepoint_reads_back_with_every_file_listed(tmp_path):
    sp = make_savepoint(tmp_path)
    assert sp.name == "savepoint-7-abc"
    read = read_manifest(sp)
    assert read.epoch == 7 and read.operator("counts").stores[0].rows == 10
    assert [f["path"] for f in read.files] == ["checkpoint/metadata", "checkpoint/offsets/7"]
    assert read.format_version == FORMAT_VERSION


def test_an_interrupted_savepoint_is_incomplete_and_never_read(tmp_path):
    work = inprogress_dir(tmp_path, 3, "zzz")
    (work / "checkpoint").mkdir(parents=True)
    with pytest.raises(SavepointError, match="incomplete savepoint"):
        read_manifest(work)
    write_manifest(work, manifest())  # even with its manifest written, until renamed
    with pytest.raises(SavepointError, match="incomplete savepoint"):
        read_manifest(work)
    assert incomplete_savepoints(tmp_path) == [work]


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: p.write_bytes(p.read_bytes()[:40]), "damaged"),
    (lambda p: p.write_text("[1, 2]"), "not the manifest of an exactly savepoint"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "format_version": 99})),
     "format version 99, written by a newer exactly"),
    (lambda p: p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items()
                                        if k != "epoch"})), "lacks or mistypes a field"),
])
def test_a_damaged_manifest_fails_naming_the_damage(tmp_path, damage, message):
    sp = make_savepoint(tmp_path)
    damage(sp / "_metadata")
    with pytest.raises(SavepointError, match=message):
        read_manifest(sp)


def test_a_missing_or_altered_file_fails_the_check(tmp_path):
    sp = make_savepoint(tmp_path)
    (sp / "checkpoint" / "offsets" / "7").write_text("v1\n{}\n{\"rows\": 11}")
    with pytest.raises(SavepointError, match="truncated or altered"):
        read_manifest(sp)
    (sp / "checkpoint" / "offsets" / "7").unlink()
    with pytest.raises(SavepointError, match="lacks checkpoint/offsets/7"):
        read_manifest(sp)


def test_dispose_deletes_savepoints_and_refuses_other_directories(tmp_path):
    sp = make_savepoint(tmp_path / "sps")
    other = tmp_path / "data"
    other.mkdir()
    with pytest.raises(SavepointError, match="not a savepoint"):
        dispose(other)
    assert other.exists()
    dispose(sp)
    assert not sp.exists()
    work = inprogress_dir(tmp_path / "sps", 1, "x")
    work.mkdir()
    dispose(work)
    assert not work.exists()
