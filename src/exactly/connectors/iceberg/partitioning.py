"""The ``partitionBy`` option of ``exactly.iceberg``: an Iceberg partition spec in words.

``"key"``, ``"day(ts)"``, ``"hour(ts), key"``, ``"bucket(16, id)"``, ``"truncate(4, name)"``:
a comma-separated list of columns (identity) and transforms (``year``, ``month``, ``day``,
``hour``, also Spark's plurals ``years``/``months``/``days``/``hours``, ``bucket(N, col)``,
``truncate(W, col)``). It is applied when the sink creates the table; an existing table keeps
its own spec, and a ``partitionBy`` that differs from it is refused.
"""

from __future__ import annotations

import re
from typing import Any

from exactly.errors import ConfigError

_TERM = re.compile(r"^\s*(?:(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?([\w.]+)\s*\)|([\w.]+))\s*$")
_TIME = {"year": "YearTransform", "years": "YearTransform", "month": "MonthTransform",
         "months": "MonthTransform", "day": "DayTransform", "days": "DayTransform",
         "hour": "HourTransform", "hours": "HourTransform"}


def split_terms(text: str) -> list[str]:
    """The terms of ``text`` (commas inside parentheses do not split)."""
    terms: list[str] = []
    depth, current = 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current)
    return [t.strip() for t in terms if t.strip()]


def parse_partitioning(text: str) -> list[tuple[str, Any]]:
    """``[(source column, pyiceberg transform)]`` of a ``partitionBy`` value. ConfigError
    naming the term and the accepted forms for anything else."""
    import pyiceberg.transforms as transforms

    fields: list[tuple[str, Any]] = []
    for term in split_terms(text or ""):
        match = _TERM.match(term)
        if match is None:
            raise _bad(term)
        function, number, column, plain = match.groups()
        if plain:
            fields.append((plain, transforms.IdentityTransform()))
            continue
        name = function.lower()
        if name in _TIME and number is None:
            fields.append((column, getattr(transforms, _TIME[name])()))
        elif name == "bucket" and number is not None:
            fields.append((column, transforms.BucketTransform(int(number))))
        elif name == "truncate" and number is not None:
            fields.append((column, transforms.TruncateTransform(int(number))))
        elif name == "identity" and number is None:
            fields.append((column, transforms.IdentityTransform()))
        else:
            raise _bad(term)
    return fields


def build_spec(schema: Any, fields: list[tuple[str, Any]]) -> Any:
    """The partition spec of ``fields`` over the Iceberg ``schema`` (ConfigError naming a
    column the stream does not have or a transform its type does not take)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec

    parts = []
    for number, (column, transform) in enumerate(fields):
        try:
            source = schema.find_field(column)
        except ValueError:
            raise ConfigError(
                f"exactly.iceberg: partitionBy names the column {column!r}, which the stream "
                f"does not have (its columns: {', '.join(f.name for f in schema.fields)})"
            ) from None
        if not transform.can_transform(source.field_type):
            raise ConfigError(f"exactly.iceberg: partitionBy {transform}({column}) does not "
                              f"apply to a column of type {source.field_type}")
        name = column if str(transform) == "identity" else f"{column}_{_suffix(transform)}"
        parts.append(PartitionField(source_id=source.field_id, field_id=1000 + number,
                                    transform=transform, name=name))
    return PartitionSpec(*parts)


def describe_spec(spec: Any, schema: Any) -> str:
    """A spec in the words of ``partitionBy`` (``"day(ts), key"``; ``"none"`` unpartitioned)."""
    terms = []
    for f in spec.fields:
        column = schema.find_column_name(f.source_id)
        text = str(f.transform)
        if text == "identity":
            terms.append(column)
        elif "[" in text:  # bucket[16], truncate[4]
            kind, width = text.rstrip("]").split("[")
            terms.append(f"{kind}({width}, {column})")
        else:
            terms.append(f"{text}({column})")
    return ", ".join(terms) or "none"


def _suffix(transform: Any) -> str:
    return str(transform).replace("[", "_").rstrip("]")


def _bad(term: str) -> ConfigError:
    return ConfigError(
        f"exactly.iceberg: partitionBy term {term!r} is not one of: COLUMN, year(COLUMN), "
        "month(COLUMN), day(COLUMN), hour(COLUMN), bucket(N, COLUMN), truncate(W, COLUMN)")
