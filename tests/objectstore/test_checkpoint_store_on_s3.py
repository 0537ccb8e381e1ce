"""The checkpoint's own files on S3 (S3Proxy): the history as immutable objects, the job's
status claimed by a conditional PUT, and the one-line errors for an S3 checkpoint that
cannot be used, before anything starts."""

from __future__ import annotations

import os
import threading
import time

import pytest
from click.testing import CliRunner

from exactly.checkpoint.history import ObjectHistoryStore, append_now, open_history
from exactly.checkpoint.location import job_store
from exactly.checkpoint.reach import check_reachable
from exactly.checkpoint.status import JobStatus, claim_job
from exactly.cli import main
from exactly.errors import ConfigError, FencedError
from exactly.procs import current_process, process_id
from exactly.testing.ports import free_port


def test_history_on_s3_keeps_every_record_once_in_order_while_two_writers_pack_it(s3_bucket):
    """Two writers append 60 records each; packing (every 16 records) runs meanwhile in
    both. A reader that reads all along sees the records only grow, and the end holds all
    120 once, each writer's in its own order."""
    checkpoint = f"s3a://{s3_bucket}/ck"
    seen: list[int] = []
    done = threading.Event()

    def write(writer: int) -> None:
        history = ObjectHistoryStore(job_store(checkpoint), pack_every=16)
        for n in range(60):
            history.append({"kind": "epoch", "at": time.time(), "writer": writer, "n": n})

    def read() -> None:
        history = open_history(checkpoint)
        while not done.is_set():
            seen.append(len(history.read().records))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in (0, 1)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    reader.join()
    records = open_history(checkpoint).read().records
    assert sorted((r["writer"], r["n"]) for r in records) == [
        (w, n) for w in (0, 1) for n in range(60)]
    for writer in (0, 1):
        assert [r["n"] for r in records if r["writer"] == writer] == list(range(60))
    assert seen == sorted(seen), "a reader saw records disappear while they were packed"
    names = job_store(checkpoint).list("history")
    # packed: segments exist and fewer records are left loose than the bound the store
    # promises, pack_every times (writers + 1): each writer counts the records only every
    # pack_every of its own appends, so both may add up to 15 after their last count, on top
    # of up to 15 a count found too few to pack (how many segments depends on how the two
    # writers' packs interleave: one may take records the other would have packed)
    assert sum(n.startswith("s-") for n in names) >= 1
    assert sum(n.startswith("r-") for n in names) < 16 * (2 + 1)


def test_history_on_s3_is_bounded_and_append_now_writes_there(s3_bucket):
    checkpoint = f"s3a://{s3_bucket}/ck"
    history = ObjectHistoryStore(job_store(checkpoint), pack_every=4, max_segments=2)
    for n in range(20):
        history.append({"kind": "epoch", "at": time.time(), "n": n})
    kept = [r["n"] for r in history.read().records]
    assert kept == list(range(20 - len(kept), 20)) and 8 <= len(kept) < 12
    assert append_now(checkpoint, {"kind": "savepoint", "epoch": 7})
    assert open_history(checkpoint).read().records[-1]["kind"] == "savepoint"


def test_two_claims_of_one_s3_checkpoint_cannot_both_win(s3_bucket):
    store = job_store(f"s3a://{s3_bucket}/ck")
    me = current_process()
    assert claim_job(store, JobStatus("r1", me, "starting", job="a.py")) is None
    other = JobStatus("r2", process_id(os.getppid()), "starting", job="a.py")  # alive
    with pytest.raises(FencedError, match="already run by"):
        claim_job(store, other)
    with pytest.raises(ConfigError, match=r"holds the job a\.py"):
        claim_job(store, JobStatus("r3", me, "starting", job="b.py"))


def test_an_unreachable_endpoint_a_missing_bucket_and_bad_keys_fail_in_one_line(
        s3_server, s3_bucket, monkeypatch):
    check_reachable(f"s3a://{s3_bucket}/ck")  # the server and bucket of the fixture: fine
    with pytest.raises(ConfigError, match=r"the bucket 'nowhere-\w+' does not exist"):
        check_reachable("s3a://nowhere-bucket/ck")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(ConfigError, match="credentials of AWS_ACCESS_KEY_ID may not use"):
        check_reachable(f"s3a://{s3_bucket}/ck")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    with pytest.raises(ConfigError, match=rf"cannot reach the S3 endpoint {closed} "
                                          r"\(AWS_ENDPOINT_URL\)"):
        check_reachable(f"s3a://{s3_bucket}/ck")
    result = CliRunner().invoke(main, ["checkpoints", f"s3a://{s3_bucket}/ck"])
    assert result.exit_code == 2 and "(AWS_ENDPOINT_URL)" in result.output
    assert len([line for line in result.output.splitlines() if "AWS_ENDPOINT_URL" in line]) == 1


def test_exactly_run_refuses_a_prefix_that_holds_another_job(s3_bucket, tmp_path):
    checkpoint = f"s3a://{s3_bucket}/ck"
    JobStatus("old", current_process(), "stopped", job="orders.py").write(job_store(checkpoint))
    job = tmp_path / "payments.py"
    job.write_text("def build(spark):\n    raise AssertionError('must not run')\n")
    result = CliRunner().invoke(main, ["run", str(job), "--checkpoint", checkpoint])
    assert result.exit_code != 0
    assert f"checkpoint {checkpoint} holds the job orders.py" in result.output
    assert JobStatus.read(job_store(checkpoint)).run_id == "old"  # nothing was started


def test_a_start_on_an_s3_checkpoint_missing_a_committed_epoch_fails_before_spark_runs(
        s3_bucket, tmp_path):
    """The start check of epoch identity reads Spark's offsets log on S3 too (it was skipped
    for a checkpoint that is not local: only the first commit would have refused)."""
    import json as _json

    import pyarrow as pa

    from exactly.checkpoint.location import open_store
    from exactly.connectors.files.sink import FileSink
    from exactly.errors import ReplannedEpochError
    from exactly.protocol.contract import SinkSettings
    from exactly.protocol.epoch_identity import check_checkpoint_against_log
    from exactly.testing.harness import ProtocolHarness

    checkpoint = f"s3a://{s3_bucket}/ck"
    store = open_store(checkpoint)
    query = "5f1e1f5e-0000-4000-8000-000000000001"
    store.write("metadata", _json.dumps({"id": query}).encode())
    sink = FileSink(str(tmp_path / "out"))
    h = ProtocolHarness(sink, SinkSettings(checkpoint_location=checkpoint), query_id=query,
                        visible=list)
    for epoch in (0, 1):
        store.write(f"offsets/{epoch}", (
            "v1\n" + _json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": epoch}) + "\n"
            + _json.dumps({"count": epoch + 1})).encode())
        h.run_epoch(epoch, [pa.record_batch({"id": [epoch * 10 + i for i in range(5)]})])
    check_checkpoint_against_log(checkpoint, sink.log_directory)  # consistent: fine
    store.delete("offsets/1")
    with pytest.raises(ReplannedEpochError, match="no longer holds offsets/1"):
        check_checkpoint_against_log(checkpoint, sink.log_directory)
