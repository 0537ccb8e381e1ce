"""Moving whole files and trees between a store (:mod:`exactly.checkpoint.store`) and a local
directory: what lives on S3 is staged through a local directory for the code that needs
files (Spark's state providers, the savepoint code, the offline tools).

What is atomic: one file (an S3 PUT, a copy on a POSIX directory). A tree is not: a copy that
is interrupted leaves some of its files, so every caller says what marks its tree complete
(a savepoint's manifest, uploaded last; a restore's marker). Hadoop's checksum files
(``.<name>.crc``) are never copied: S3A writes none and reads none.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from exactly.checkpoint.store import LocalLogStore, LogStore

#: parallel transfers of one tree (each a boto3 managed transfer of its own)
TRANSFERS = 8


def is_checksum(name: str) -> bool:
    """A Hadoop checksum file ``.<name>.crc``."""
    base = name.rsplit("/", 1)[-1]
    return base.startswith(".") and base.endswith(".crc")


def fetch_all(store: LogStore, names: Iterable[str], directory: Path) -> None:
    """Download every one of ``names`` to the same name below ``directory``."""
    _each(lambda n: store.download(n, directory / n), names)


def put_all(store: LogStore, directory: Path, names: Iterable[str]) -> None:
    """Upload every one of ``names`` below the local ``directory`` to the same name."""
    _each(lambda n: store.upload(n, directory / n), names)


def _files(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file() and not is_checksum(p.name))


def _each(action: Callable[[str], object], names: Iterable[str]) -> None:
    """``action`` on every name, in parallel; the first error is raised once all ended."""
    names = list(names)
    if len(names) <= 1:
        for name in names:
            action(name)
        return
    with ThreadPoolExecutor(max_workers=min(TRANSFERS, len(names))) as pool:
        for future in [pool.submit(action, name) for name in names]:
            future.result()


def upload_tree(directory: Path, store: LogStore, *, last: Iterable[str] = (),
                before_last: Callable[[], object] | None = None) -> list[str]:
    """Copy every file below the local ``directory`` (but checksum files) to ``store``
    under the same relative names; the names in ``last`` only after every other file is
    stored (``before_last`` runs in between). Returns the names copied. Not atomic: an
    interrupted upload leaves some files, never one of ``last`` without all the others."""
    names = _files(directory)
    final = [n for n in last if n in names]
    put_all(store, directory, [n for n in names if n not in final])
    if before_last is not None:
        before_last()
    for name in final:
        store.upload(name, directory / name)
    return names


def download_tree(store: LogStore, directory: Path, folder: str = "") -> list[str]:
    """Copy every file below ``folder`` of ``store`` (but checksum files) into the local
    ``directory``; returns the names copied (relative to ``folder``)."""
    prefix = f"{folder.rstrip('/')}/" if folder else ""
    names = sorted(n for n in store.list_tree(folder) if not is_checksum(n))
    _each(lambda n: store.download(prefix + n, directory / n), names)
    return names


def delete_tree(store: LogStore, folder: str = "", *, first: Iterable[str] = ()) -> int:
    """Delete every file below ``folder`` of ``store``, the names in ``first`` (relative to
    ``folder``) before the others; returns how many were deleted. On a POSIX directory the
    folder goes whole."""
    if isinstance(store, LocalLogStore):
        root = store.root / folder if folder else store.root
        count = sum(1 for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0
        for name in first:
            (root / name).unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
        return count
    prefix = f"{folder.rstrip('/')}/" if folder else ""
    names = store.list_tree(folder)
    ordered = [n for n in first if n in names]
    for name in ordered:
        store.delete(prefix + name)
    _each(lambda n: store.delete(prefix + n), [n for n in names if n not in ordered])
    return len(names)
