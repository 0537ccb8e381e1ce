"""exactly's per-user cache: ``$XDG_CACHE_HOME/exactly`` (``~/.cache/exactly`` when that is
unset or not absolute). Holds what the setup script fetches or builds once: the Kafka jars,
the compiled state writer, the driver's class archive."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache(kind: str) -> Path:
    """``<cache>/exactly/<kind>``; not created here."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "exactly" / kind
