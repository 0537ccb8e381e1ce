"""The oracle and the reader of the aggregate pipeline's PostgreSQL table
(``exactly.demos.postgres_job --pipeline aggregate``), shared by the classic and the Connect
chaos tests: a crash-free batch run's per-key totals, and a poller that records any count
that went down while the job ran."""

from __future__ import annotations

import numpy as np

from exactly.connectors.datagen import generate
from exactly.testing.readers import BackgroundReader


def expected_totals(rows: int, keys: int) -> dict[str, tuple[int, int]]:
    """A crash-free batch run of the aggregate pipeline: per key (events, total cents)."""
    data = generate(0, rows, keys=keys, seed=0).to_pandas()
    data["cents"] = np.round(data["amount"] * 100).astype(np.int64)
    grouped = data.groupby("key").agg(events=("id", "size"), total=("cents", "sum"))
    return {k: (int(r.events), int(r.total)) for k, r in grouped.iterrows()}


class CountPoller(BackgroundReader):
    """Reads the per-key counts during the whole run; records any count that went down."""

    def __init__(self, pg, table: str) -> None:
        super().__init__()
        self.pg, self.table = pg, table
        self.seen: dict[str, int] = {}
        self.backwards: list[tuple[str, int, int]] = []
        self.reads = 0

    def run(self) -> None:
        import psycopg

        while not self.stopping.is_set():
            try:
                with self.pg.connect() as c:
                    while not self.stopping.is_set():
                        rows = c.execute(f'SELECT key, events FROM "{self.table}"').fetchall()
                        self.reads += 1
                        for key, events in rows:
                            if events < self.seen.get(key, 0):
                                self.backwards.append((key, self.seen[key], events))
                            self.seen[key] = events
                        self.stopping.wait(0.1)
            except psycopg.Error:  # table not there yet
                self.stopping.wait(0.2)
