"""The driver's garbage collector settled once per process (exactly.spark.gc_freeze), in a
process of its own so that this test run's collector is left alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_freeze_once_freezes_what_is_alive_once_and_later_cycles_are_still_collected():
    script = textwrap.dedent("""
        import gc, weakref
        from exactly.spark.gc_freeze import freeze_once

        class Node:
            pass

        first, again = freeze_once(), freeze_once()
        frozen = gc.get_freeze_count()
        a, b = Node(), Node()
        a.other, b.other = b, a  # a reference cycle made after the freeze
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        print(first, again, frozen > 1000, gone() is None)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False", "True", "True"]
