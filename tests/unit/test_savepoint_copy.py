"""What a savepoint copies of a checkpoint, on real files: the chain of state files of the
last completed epoch, and when Spark's maintenance replaces that chain by a snapshot while
the copy runs (the deltas deleted between listing and copying), the new chain instead; a
state version that cannot be loaded at all fails naming the missing file."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.checkpoint.store import LocalLogStore
from exactly.errors import SavepointError
from exactly.savepoints.take import copy_epoch


def checkpoint(root: Path, *deltas: int) -> Path:
    """Epochs 0 and 1 done; one operator, one partition, the hashmap store's deltas."""
    for name, text in {"metadata": '{"id": "q"}', "offsets/0": "v1\n{}\n0",
                       "offsets/1": "v1\n{}\n1", "commits/0": "v1\n{}", "commits/1": "v1\n{}",
                       "state/0/_metadata/metadata": "v1\n{}"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for version in deltas:
        (root / "state/0/0").mkdir(parents=True, exist_ok=True)
        (root / f"state/0/0/{version}.delta").write_bytes(b"delta %d" % version)
    return root


class Maintained(LocalLogStore):
    """A checkpoint whose maintenance runs right after the copy's first listing of its
    state: version 2 becomes a snapshot, and the deltas it replaces are deleted."""

    runs = 0

    def list_tree(self, folder: str) -> list[str]:
        names = super().list_tree(folder)
        if folder == "state" and self.runs == 0:
            self.runs += 1
            (self.root / "state/0/0/2.snapshot").write_bytes(b"snapshot 2")
            for version in (1, 2):
                (self.root / f"state/0/0/{version}.delta").unlink()
        return names


def test_the_copy_takes_the_state_chain_of_the_last_completed_epoch(tmp_path):
    ck = checkpoint(tmp_path / "ck", 1, 2, 3)  # version 3 belongs to an epoch in flight
    copied = copy_epoch(str(ck), 1, tmp_path / "sp", partitions=1)
    assert sorted(copied) == ["commits/0", "commits/1", "metadata", "offsets/0", "offsets/1",
                              "state/0/0/1.delta", "state/0/0/2.delta",
                              "state/0/_metadata/metadata"]
    assert (tmp_path / "sp/state/0/0/2.delta").read_bytes() == b"delta 2"


def test_state_files_deleted_by_maintenance_during_the_copy_are_copied_from_the_new_chain(
        tmp_path):
    store = Maintained(checkpoint(tmp_path / "ck", 1, 2))
    copied = copy_epoch(store, 1, tmp_path / "sp", partitions=1)
    assert store.runs == 1
    assert [n for n in copied if n.startswith("state/0/0/")] == ["state/0/0/2.snapshot"]
    assert sorted(p.name for p in (tmp_path / "sp/state/0/0").iterdir()) == ["2.snapshot"]


def test_a_state_version_that_cannot_be_loaded_fails_naming_the_missing_file(tmp_path):
    ck = checkpoint(tmp_path / "ck", 2)  # 1.delta is gone and no snapshot replaces it
    with pytest.raises(SavepointError, match=r"1\.delta is missing"):
        copy_epoch(str(ck), 1, tmp_path / "sp", partitions=1)
