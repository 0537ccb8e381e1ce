"""Print the nemesis soak's summary table from its JSON-lines report (``scripts/soak
--nemesis``): one row per sink and a total -- faults by kind, recoveries, epochs, records
audited, anomalies by kind, processes left, leftover prepared transactions or staged files.

    python -m exactly.testing.nemesis.table REPORT.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

COLUMNS = ["faults", "answer_faults_fired", "recoveries", "epochs", "records_audited",
           "missing", "duplicated", "anomalies", "processes_left", "leftovers", "wall_s"]


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items())) or "0"
    return str(value)


def render(rows: list[dict[str, Any]]) -> str:
    """The markdown table of ``rows`` (the summaries of tests/chaos/test_nemesis.py)."""
    total: dict[str, Any] = {"sink": "**total**"}
    for column in COLUMNS:
        values = [r.get(column, 0) for r in rows]
        if values and isinstance(values[0], dict):
            merged: Counter[str] = Counter()
            for v in values:
                merged.update(v)
            total[column] = dict(merged)
        else:
            total[column] = round(sum(values), 1)
    total["faults_total"] = sum(total["faults"].values())
    for r in rows:
        r["faults_total"] = sum(r.get("faults", {}).values())
    head = ["sink", "faults_total", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in [*rows, total]:
        lines.append("| " + " | ".join(_cell(r.get(c, "")) for c in head) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in Path(argv[0]).read_text().splitlines()
            if line.strip()]
    if not rows:
        print("no nemesis summary was written", file=sys.stderr)
        return 1
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
