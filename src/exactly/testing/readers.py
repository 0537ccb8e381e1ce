"""Readers that watch a sink's output while a job runs (what a consumer would see)."""

from __future__ import annotations

import threading
from typing import Self


class BackgroundReader:
    """Runs :meth:`run` in a daemon thread from entering the ``with`` block to leaving it.

    ``run`` loops until :attr:`stopping` is set (wait on it instead of sleeping, so the
    block ends promptly); :meth:`finish` runs once the thread has ended (e.g. one last
    look at the final state).
    """

    #: seconds to wait for the thread when the block ends
    join_timeout: float = 30.0

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Called after the thread ended; default: nothing."""

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._thread.join(timeout=self.join_timeout)
        self.finish()
