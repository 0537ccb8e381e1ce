"""exactly's per-user cache: ``$XDG_CACHE_HOME/exactly`` (``~/.cache/exactly`` when that is
unset or not absolute). Holds what the setup script fetches or builds once: the Kafka jars,
the compiled state writer, the driver's class archive, the S3Proxy and S3A jars."""

from __future__ import annotations

import os
from pathlib import Path

from exactly.errors import ConfigError


def user_cache(kind: str) -> Path:
    """``<cache>/exactly/<kind>``; not created here."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "exactly" / kind


def configured_dir(env: str, default: Path) -> Path:
    """The directory named by environment variable ``env`` if set, else ``default``."""
    configured = os.environ.get(env)
    return Path(configured).expanduser() if configured else default


def missing_jars(what: str, directory: Path, env: str, part: str,
                 cache: Path) -> ConfigError:
    """The error for jars that are not in ``directory``, naming both fixes: ``scripts/setup.sh
    PART``, which fetches them into ``cache``, or ``env`` naming a directory that holds them."""
    if os.environ.get(env):
        where = f"{directory} (from {env})"
        fix = (f"point {env} at a directory holding them, or unset it and run "
               f"scripts/setup.sh {part} to fetch them into {cache}")
    else:
        where = str(directory)
        fix = (f"run scripts/setup.sh {part} to fetch them from Maven "
               f"Central, or set {env} to a directory holding them")
    return ConfigError(f"{what} are missing in {where}: {fix}")
