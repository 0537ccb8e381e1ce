"""The class archive cache keeps the newest archives: a second clone on the machine does not
take the first one's archive away."""

import os

from exactly.spark.class_archive import prune


def test_pruning_keeps_the_newest_archives_and_deletes_only_older_ones(tmp_path):
    for age, name in enumerate(["a", "b", "c", "d", "e"]):
        archive = tmp_path / f"spark-driver-4.3.0-{name}.jsa"
        archive.write_bytes(b"x")
        os.utime(archive, (1_000_000 - age, 1_000_000 - age))  # a newest, e oldest
    (tmp_path / "exactly-state-x.jar").write_bytes(b"jar")
    deleted = prune(tmp_path, keep=3)
    assert sorted(p.name for p in deleted) == ["spark-driver-4.3.0-d.jsa",
                                               "spark-driver-4.3.0-e.jsa"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "exactly-state-x.jar", "spark-driver-4.3.0-a.jsa", "spark-driver-4.3.0-b.jsa",
        "spark-driver-4.3.0-c.jsa"]
