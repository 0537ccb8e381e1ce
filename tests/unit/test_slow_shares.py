"""The slow lane's shares (tests/lanes.py): every slow proof is in exactly one share of N, the
same one on every run and machine whatever other tests exist; ``--slow-share`` refuses
anything but K/N with 1 <= K <= N; the default lane skips slow proofs and soaks, a share
runs its own slow proofs and never a soak, EXACTLY_SLOW=1 runs everything."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from lanes import SHARES, ci_share, parse_share, share_of, split, why_skipped

ROOT = Path(__file__).resolve().parents[2]

#: test ids of the shapes the suite has: plain, parametrized, ids with "-", "/", "." and
#: non-ASCII characters
IDS = [
    "tests/chaos/test_delta_chaos.py::test_delta_sink_killed_at_every_protocol_point_commits_"
    "every_event_exactly_once[s3-every-point]",
    "tests/postgres/test_pg_chaos.py::test_running_aggregates_in_update_mode_equal_a_crash_"
    "free_batch_run[2pc-aggregate-every-point]",
    "tests/kafka/test_kafka_chaos.py::test_side_by_side_with_sparks_kafka_sink",
    "tests/savepoints/test_savepoints_every_backend.py::test_savepoints_of_the_first_epochs_"
    "restore_rescaled_onto_every_backend[rocksdb-changelog-epochs-0-3]",
    "tests/chaos/test_multi_input_chaos.py::test_union_killed_at_a_protocol_point_commits_"
    "both_inputs_exactly_once[after_intent]",
    "tests/ops/test_x.py::test_y[s3a://bucket/ck-1.5]",
    "tests/ops/test_x.py::test_y[Zürich]",
    *(f"tests/spark/test_many.py::test_case[{i}]" for i in range(200)),
]


def slow_ids_of_this_session(request) -> list[str]:
    """The slow proofs collected with this test (all of them when the whole suite runs)."""
    return [item.nodeid for item in request.session.items
            if item.get_closest_marker("slow") and not item.get_closest_marker("soak")]


def test_every_slow_test_is_in_exactly_one_share(request):
    ids = IDS + slow_ids_of_this_session(request)
    for shares in range(1, 7):
        found = split(ids, shares)
        assert sorted(found) == list(range(1, shares + 1))
        together = [nodeid for share in found.values() for nodeid in share]
        assert sorted(together) == sorted(ids)  # none lost, none twice
        for share, members in found.items():
            assert all(share_of(nodeid, shares) == share for nodeid in members)
            runs = [nodeid for nodeid in ids
                    if why_skipped(nodeid, slow=True, soak=False, share=(share, shares),
                                   everything=False) is None]
            assert runs == members  # --slow-share K/N runs exactly share K's slow proofs


def test_a_tests_share_is_a_checksum_of_its_id_alone():
    """Not Python's ``hash`` (salted per process): CRC-32, the same on every machine and
    whatever other tests exist; fixed values pin it."""
    nodeid = "tests/kafka/test_kafka_chaos.py::test_side_by_side_with_sparks_kafka_sink"
    assert [share_of(nodeid, n) for n in range(1, 7)] == [
        zlib.crc32(nodeid.encode()) % n + 1 for n in range(1, 7)]
    assert zlib.crc32(b"tests/a.py::test_b") == 4208492297
    assert [share_of("tests/a.py::test_b", n) for n in range(1, 7)] == [1, 2, 3, 2, 3, 6]
    # a test keeps its share whatever other tests there are
    whole = split(IDS, 4)
    assert split(IDS[:3], 4) == {k: [i for i in v if i in IDS[:3]] for k, v in whole.items()}


def test_the_share_is_the_same_in_another_process_with_another_hash_seed():
    code = ("import sys; sys.path.insert(0, 'tests'); from lanes import share_of; "
            f"print([share_of(i, 5) for i in {IDS[:20]!r}])")
    shares = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                             text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout
              for seed in ("1", "2", "random")}
    assert shares == {f"{[share_of(i, 5) for i in IDS[:20]]}\n"}


def test_a_share_is_k_of_n():
    assert [parse_share(text) for text in ("1/1", "2/4", "4/4", " 3 / 5 ")] == [
        (1, 1), (2, 4), (4, 4), (3, 5)]


def test_a_share_out_of_range_or_not_k_of_n_is_refused_naming_the_form():
    for text in ["0/3", "4/3", "1/0", "0/0", "-1/3", "3", "1/", "/3", "a/b", "1/2/3", "1.0/2",
                 ""]:
        with pytest.raises(ValueError, match=r"K/N"):
            parse_share(text)
    with pytest.raises(ValueError):
        share_of("tests/a.py::test_b", 0)


def test_pytest_refuses_a_bad_slow_share_as_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "--slow-share", "5/4",
                           "tests/unit/test_slow_shares.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "--slow-share '5/4'" in done.stderr and "K/N" in done.stderr


def test_which_tests_run_in_the_default_lane_a_share_and_everything():
    nodeid = "tests/kafka/test_kafka_chaos.py::test_side_by_side_with_sparks_kafka_sink"
    own = share_of(nodeid, 3)
    other = own % 3 + 1

    def skipped(slow=False, soak=False, share=None, everything=False) -> str | None:
        return why_skipped(nodeid, slow=slow, soak=soak, share=share, everything=everything)

    assert skipped() is None  # the default lane
    default = skipped(slow=True)
    assert default is not None
    assert f"--slow-share {share_of(nodeid, SHARES)}/{SHARES}" in default
    assert skipped(slow=True, share=(own, 3)) is None
    assert f"run ./scripts/test --slow-share {own}/3" in skipped(slow=True, share=(other, 3))
    assert skipped(soak=True) is not None
    assert "scripts/soak" in skipped(soak=True, share=(own, 3))  # never in a share
    assert skipped(soak=True, slow=True, share=(own, 3)) is not None
    for flags in ({"slow": True}, {"soak": True}, {}):
        assert skipped(**flags, everything=True) is None  # EXACTLY_SLOW=1
        assert skipped(**flags, share=(other, 3), everything=True) is None


def test_consecutive_ci_landings_run_every_share_in_turn():
    """--slow-share ci: N consecutive landings take every share once."""
    for shares in range(1, 7):
        taken = [ci_share(landings, shares) for landings in range(100, 100 + shares)]
        assert sorted(k for k, _ in taken) == list(range(1, shares + 1))
        assert {n for _, n in taken} == {shares}
    with pytest.raises(ValueError):
        ci_share(-1)
