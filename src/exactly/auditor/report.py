"""What ``exactly verify`` found: counts per kind of mismatch, a sample of each, and where
the target records epochs, the breakdown per epoch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Finding:
    """How many keys show one kind of mismatch, and up to a sample of them (with values)."""

    count: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)

    def render(self, keys: list[str]) -> str:
        if not self.count:
            return "0"
        shown = "; ".join(_show(row, keys) for row in self.sample)
        return f"{self.count}  (e.g. {shown})"

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "sample": self.sample}


def _show(row: dict[str, Any], keys: list[str]) -> str:
    key = (str(row[keys[0]]) if len(keys) == 1
           else "(" + ", ".join(f"{k}={row[k]}" for k in keys) + ")")
    rest = [f"{k}: {v}" for k, v in row.items() if k not in keys]
    return key + (" " + ", ".join(rest) if rest else "")


@dataclass
class EpochLine:
    """One epoch of the target: its rows, and how many of them are part of a mismatch."""

    epoch: int | None
    rows: int
    duplicated_rows: int
    unexpected_rows: int
    differing_rows: int

    @property
    def ok(self) -> bool:
        return not (self.duplicated_rows or self.unexpected_rows or self.differing_rows)


@dataclass
class VerifyReport:
    """The audit's verdict. ``ok`` only when every expected key is in the target exactly
    once, nothing else is, compared values agree and no value moved backwards."""

    input: str
    output: str
    keys: list[str]
    compared: list[str]
    expected_keys: int
    found_rows: int
    missing: Finding
    duplicated: Finding
    duplicate_extra_rows: int
    unexpected: Finding
    differing: Finding
    input_duplicates: int = 0
    input_rows_without_key: int = 0
    output_rows_without_key: int = 0
    backwards: Finding | None = None
    epochs: list[EpochLine] | None = None
    latest_by_key: bool = False

    @property
    def ok(self) -> bool:
        return not (self.missing.count or self.duplicated.count or self.unexpected.count
                    or self.differing.count or self.output_rows_without_key
                    or (self.backwards is not None and self.backwards.count))

    def rows(self) -> list[tuple[str, str]]:
        """The report as (check, result) lines, the verdict last."""
        noun = "ids" if self.keys == ["id"] else "keys"
        extra = f"  [{self.duplicate_extra_rows} extra rows]" if self.duplicate_extra_rows else ""
        lines = [
            (f"expected {noun}", str(self.expected_keys)),
            ("output rows" + (" (latest per key)" if self.latest_by_key else ""),
             str(self.found_rows)),
            (f"missing {noun}", self.missing.render(self.keys)),
            (f"duplicated {noun}", self.duplicated.render(self.keys) + extra),
            (f"unexpected {noun}", self.unexpected.render(self.keys)),
        ]
        if self.compared:
            lines.append((f"differing values ({', '.join(self.compared)})",
                          self.differing.render(self.keys)))
        if self.backwards is not None:
            lines.append(("values that moved backwards", self.backwards.render(self.keys)))
        if self.output_rows_without_key:
            lines.append((f"output rows without {' or '.join(self.keys)}",
                          str(self.output_rows_without_key)))
        lines.append((f"input rows without {' or '.join(self.keys)}",
                      str(self.input_rows_without_key)))
        if self.input_duplicates:
            lines.append((f"{noun} repeated in the expected rows", str(self.input_duplicates)))
        lines.append(("verdict", "EXACTLY ONCE" if self.ok else "MISMATCH"))
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "input": self.input, "output": self.output, "keys": self.keys,
            "compared": self.compared, "expected": self.expected_keys,
            "found_rows": self.found_rows, "latest_by_key": self.latest_by_key,
            "missing": self.missing.to_json(), "duplicated": self.duplicated.to_json(),
            "duplicate_extra_rows": self.duplicate_extra_rows,
            "unexpected": self.unexpected.to_json(), "differing": self.differing.to_json(),
            "moved_backwards": None if self.backwards is None else self.backwards.to_json(),
            "input_duplicates": self.input_duplicates,
            "input_rows_without_key": self.input_rows_without_key,
            "output_rows_without_key": self.output_rows_without_key,
            "epochs": None if self.epochs is None else [vars(e) for e in self.epochs],
        }
