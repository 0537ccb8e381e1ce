"""The slow lane's shares: which slow proofs a run includes (tests/conftest.py).

The default lane skips every test marked ``slow`` (a long proof) or ``soak`` (a long run
driven by knobs: scripts/soak). ``--slow-share K/N`` adds share K of N of the slow proofs,
so that a CI cycling K through 1..N runs every slow proof once every N runs (``--slow-share
ci``: K from the number of commits, :func:`ci_share`); ``EXACTLY_SLOW=1``
(``./scripts/test --slow``, scripts/soak) runs everything, the soaks included. A test's share
is a checksum of its node id: the same on every run and machine, whatever other tests exist.
Pure functions, no pytest: tests/unit/test_slow_shares.py tests them.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

#: how ``--slow-share`` is written
SHARE_FORM = "K/N: share K of N, whole numbers with 1 <= K <= N (e.g. --slow-share 2/4)"
#: the number of shares the skip messages of the default lane name: what CI cycles through.
#: 8: CI (default lane plus one share) must stay under an hour on 2 cores; with 4, the share
#: of one CI run alone held ~2,200 s of test time (that run took 66 min)
SHARES = 8


def parse_share(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``; ``ValueError`` naming the expected form otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ValueError(f"{text!r} is not of the form {SHARE_FORM}")
    share, shares = int(match.group(1)), int(match.group(2))
    if not 1 <= share <= shares:
        raise ValueError(f"{text!r}: K must be in 1..N; expected {SHARE_FORM}")
    return share, shares


def ci_share(landings: int, shares: int = SHARES) -> tuple[int, int]:
    """The share of a CI run on a commit with ``landings`` commits in its history
    (``--slow-share ci``): consecutive landings take shares 1, 2, ..., N, 1, ... so every
    slow proof runs at least once every ``shares`` landings."""
    if landings < 0:
        raise ValueError(f"landings must be >= 0, not {landings}")
    return landings % shares + 1, shares


def share_of(nodeid: str, shares: int) -> int:
    """The share (1..``shares``) of the test ``nodeid`` (``tests/x/test_y.py::test_z[p]``):
    CRC-32 of the id, not Python's salted ``hash``."""
    if shares < 1:
        raise ValueError(f"shares must be at least 1, not {shares}")
    return zlib.crc32(nodeid.encode("utf-8")) % shares + 1


def split(nodeids: Iterable[str], shares: int) -> dict[int, list[str]]:
    """Every share 1..``shares`` and its node ids, in the order given."""
    found: dict[int, list[str]] = {share: [] for share in range(1, shares + 1)}
    for nodeid in nodeids:
        found[share_of(nodeid, shares)].append(nodeid)
    return found


def why_skipped(nodeid: str, *, slow: bool, soak: bool, share: tuple[int, int] | None,
                everything: bool) -> str | None:
    """Why a test does not run in this run, or None when it runs. ``slow``/``soak``: its
    markers; ``share``: ``--slow-share``'s (K, N), None without it; ``everything``:
    EXACTLY_SLOW=1."""
    if everything:
        return None
    if soak:
        return ("soak run (its knobs: EXACTLY_SOAK_*, EXACTLY_NEMESIS_*): run scripts/soak, "
                "or ./scripts/test --slow")
    if not slow:
        return None
    shares = share[1] if share is not None else SHARES
    own = share_of(nodeid, shares)
    if share is not None and own == share[0]:
        return None
    return (f"slow proof of share {own}/{shares}: run ./scripts/test --slow-share "
            f"{own}/{shares} (./scripts/test --slow runs every share)")
