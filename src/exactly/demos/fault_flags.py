"""The fault flags of the demo jobs, as ``exactly run`` and ``exactly pipeline`` have them.

``--fault POINT[@EPOCH]``, ``--fault-marker FILE`` and ``--fault-action``
arm one crash point (fault injection for tests and drills); the crash harness
(:func:`exactly.testing.chaos.run_with_crashes`) appends them per attempt
(:meth:`exactly.protocol.faults.FaultSpec.flags`). Nothing else arms a fault in a job: the
environment arms none.
"""

from __future__ import annotations

import argparse

from exactly.protocol.faults import FaultSpec


def add_fault_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--fault``, ``--fault-marker`` and ``--fault-action`` to ``parser``."""
    group = parser.add_argument_group("fault injection (tests and drills)")
    group.add_argument("--fault", metavar="POINT[@EPOCH]", default=None,
                       help="crash at this point the first time an epoch >= EPOCH passes it "
                            "(points: `exactly faults`)")
    group.add_argument("--fault-marker", metavar="FILE", default=None,
                       help="fire at most once across restarts; FILE records where it fired")
    group.add_argument("--fault-action", metavar="kill|kill-process|pause:FILE", default=None,
                       help="SIGKILL (default) or stall at the point while FILE exists")


def fault_of(args: argparse.Namespace) -> FaultSpec | None:
    """The fault the parsed flags arm, or None; ConfigError for a malformed one."""
    return FaultSpec.from_flags(args.fault, args.fault_marker, args.fault_action)
