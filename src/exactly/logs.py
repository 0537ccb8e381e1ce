"""Structured logs: one JSON object per event, never a secret in it."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import Any

_SECRET_KEYS = re.compile(r"pass(word)?|secret|token|dsn|credential", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")


def redact(value: Any) -> Any:
    """Hide passwords in URLs/DSNs (``user:***@host``) inside strings and dicts."""
    if isinstance(value, str):
        return _URL_PASSWORD.sub(r"\1***@", value)
    if isinstance(value, dict):
        return {k: "***" if _SECRET_KEYS.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO,
              **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, json.dumps({"event": event, **redact(fields)}, default=str))


def configure(level: str | None = None) -> None:
    """Send exactly's events to stderr (level from ``EXACTLY_LOG_LEVEL``, default WARNING)."""
    level = level or os.environ.get("EXACTLY_LOG_LEVEL", "WARNING")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    root = logging.getLogger("exactly")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(level.upper())


def ensure_console() -> None:
    """Make exactly's WARNING and ERROR events reach stderr in processes where nobody set up
    logging (Spark's driver-side Python workers run the sink's commit; their stderr goes to
    the driver's console). Leaves any configuration made by the application alone."""
    root = logging.getLogger("exactly")
    if root.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(handler)
    if root.level == logging.NOTSET:
        root.setLevel(os.environ.get("EXACTLY_LOG_LEVEL", "WARNING").upper())
