"""On/off switches that exactly reads from the environment (``EXACTLY_CLASS_ARCHIVE``,
``EXACTLY_WORKER_DAEMON``): on unless set to ``off``, ``0``, ``false`` or ``no``."""

from __future__ import annotations

import os

OFF = frozenset({"0", "off", "false", "no"})


def switched_on(name: str) -> bool:
    """False when environment variable ``name`` says off (any case, spaces ignored); True
    otherwise, unset included."""
    return os.environ.get(name, "").strip().lower() not in OFF
