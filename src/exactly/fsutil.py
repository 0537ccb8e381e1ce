"""Durable, atomic file operations on a local (POSIX) file system."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from exactly.errors import CorruptFileError

#: the repair for a damaged file that has no more specific one
GENERIC_REPAIR = ("it was written atomically (temp file, fsync, rename), so the damage came from "
                  "outside (a disk fault, an interrupted copy, an edit): restore it from a "
                  "backup, or run `exactly doctor CHECKPOINT` for the repair of this file")


@contextlib.contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Errors of the block that say what failed but not on which file (PyArrow's writers:
    ``[Errno 28] Error writing bytes to file``) come out as ``OSError(errno, strerror,
    path)``, which names the file; other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno:
            raise OSError(exc.errno, os.strerror(exc.errno), os.fspath(path)) from exc
        raise


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_temp(target: Path, data: bytes, durable: bool = True) -> Path:
    """A temp file beside ``target`` holding ``data``, fsynced unless ``durable`` is False;
    errors name the target."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
    except OSError as exc:  # ENOSPC at flush names no file: name the target
        with contextlib.suppress(OSError):
            tmp.unlink()
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(target)) from exc
        raise
    return tmp


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a part.

    Temp file in the same directory, fsync, rename over the target, fsync the directory.
    """
    target = Path(path)
    os.replace(_durable_temp(target, data), target)
    fsync_dir(target.parent)


def create_exclusive_bytes(path: str | os.PathLike[str], data: bytes) -> bool:
    """Create ``path`` holding ``data`` only if it does not exist; False if it does.

    Atomic and durable like :func:`atomic_write_bytes` (temp file, fsync), but the temp file
    is hard-linked to the target, which fails when the target exists: of two writers racing
    for one name, exactly one wins and readers see its whole file.
    """
    target = Path(path)
    tmp = _durable_temp(target, data)
    try:
        os.link(tmp, target)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(target.parent)
    return True


def atomic_write_json(path: str | os.PathLike[str], value: Any) -> None:
    atomic_write_bytes(path, json.dumps(value, sort_keys=True, indent=1).encode())


def replace_json(path: str | os.PathLike[str], value: Any) -> None:
    """Write ``value`` to ``path`` whole or not at all for readers and across a crash of the
    writing process (temp file renamed over the target), without making it durable: after
    a power loss the file may be missing or empty. For records whose durability a later
    fsync of their directory and data provides, or that recovery can do without."""
    target = Path(path)
    data = json.dumps(value, sort_keys=True, indent=1).encode()
    os.replace(_durable_temp(target, data, durable=False), target)


def read_json(path: str | os.PathLike[str], repair: str | None = None) -> Any | None:
    """The JSON value at ``path``, or ``None`` when the file does not exist.

    Raises
    ------
    CorruptFileError
        When the file exists but is not JSON (torn, empty, binary): names the file, what is
        wrong and ``repair`` (the safe repair for this file; a generic one when omitted).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return parse_json(data, str(path), repair)


def parse_json(data: bytes, where: str, repair: str | None = None) -> Any:
    """``data`` (the file ``where``) as JSON; CorruptFileError naming ``where``, what is wrong
    and ``repair`` when it is not."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptFileError(where, f"is not valid JSON ({_describe(data, exc)})",
                               repair or GENERIC_REPAIR) from None


def require_fields(value: Any, path: str | os.PathLike[str], fields: tuple[str, ...],
                   repair: str | None = None) -> dict[str, Any]:
    """``value`` (read from ``path``) as a JSON object holding every one of ``fields``.

    Raises :class:`CorruptFileError` naming the file and the missing fields otherwise.
    """
    if not isinstance(value, dict):
        raise CorruptFileError(str(path), f"holds a JSON {type(value).__name__}, not an object",
                               repair or GENERIC_REPAIR)
    missing = [f for f in fields if f not in value]
    if missing:
        raise CorruptFileError(str(path), f"lacks the field(s) {', '.join(missing)}",
                               repair or GENERIC_REPAIR)
    return value


def _describe(data: bytes, exc: Exception) -> str:
    if not data:
        return "the file is empty"
    if isinstance(exc, UnicodeDecodeError):
        return f"{len(data)} bytes that are not UTF-8 text"
    return f"{len(data)} bytes, torn or damaged: {exc}"


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock (flock) held for the ``with`` block; released on crash."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
