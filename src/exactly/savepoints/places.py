"""Where savepoints and the checkpoints they come from or go to live, and moving their files.

A savepoint, a savepoint directory and a checkpoint are each a local directory or an S3
prefix (``s3://bucket/prefix``; ``s3a://`` names the same objects), opened as a
:class:`~exactly.checkpoint.store.LogStore`. The savepoint code works on local files (Spark
reads and writes the state through its local file system): what lives on S3 is staged
through a local directory with the functions here, which copy whole files with boto3's
managed transfers (multipart for big files, the store's client, endpoint and ``AWS_*``
credentials).

What is atomic: one file (an S3 PUT, a rename on a POSIX directory). A tree is not: a copy
that is interrupted leaves some of its files, so every caller says what marks its tree
complete (a savepoint's manifest, uploaded last; a restore's marker). Hadoop's checksum
files (``.<name>.crc``) are never copied: S3A writes none and reads none.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from exactly.checkpoint.location import host_dir
from exactly.checkpoint.store import LocalLogStore, LogStore, S3LogStore, is_remote

__all__ = ["delete_tree", "download_tree", "fetch", "fetch_all", "is_remote", "put", "put_all",
           "sha256_in", "staging_dir", "upload_tree"]

#: parallel transfers of one tree (each a boto3 managed transfer of its own)
TRANSFERS = 8


def _key(store: S3LogStore, name: str) -> str:
    return f"{store.prefix}/{name}" if store.prefix else name


def _is_checksum(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.startswith(".") and base.endswith(".crc")


def fetch(store: LogStore, name: str, dest: Path) -> None:
    """Copy the file ``name`` of ``store`` to the local file ``dest`` (its folder created).
    Raises FileNotFoundError when the file does not exist (deleted since it was listed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(store, LocalLogStore):
        shutil.copyfile(store.root / name, dest)
        return
    assert isinstance(store, S3LogStore)
    from botocore.exceptions import ClientError

    try:
        store.client.download_file(store.bucket, _key(store, name), str(dest))
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code")
        if status == 404 or code in ("404", "NoSuchKey"):
            raise FileNotFoundError(2, "no such object", store.describe(name)) from None
        raise


def fetch_all(store: LogStore, names: Iterable[str], directory: Path) -> None:
    """:func:`fetch` every one of ``names`` to the same name below ``directory``."""
    _each(lambda n: fetch(store, n, directory / n), names)


def put(store: LogStore, name: str, source: Path) -> None:
    """Copy the local file ``source`` to ``name`` of ``store`` (replacing it). On S3 the
    object appears whole or not at all; on a POSIX directory this is a plain copy."""
    if isinstance(store, LocalLogStore):
        target = store.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return
    assert isinstance(store, S3LogStore)
    store.client.upload_file(str(source), store.bucket, _key(store, name))


def put_all(store: LogStore, directory: Path, names: Iterable[str]) -> None:
    """:func:`put` every one of ``names`` below the local ``directory`` to the same name."""
    _each(lambda n: put(store, n, directory / n), names)


def _files(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file() and not _is_checksum(p.name))


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
        put(store, name, directory / name)
    return names


def download_tree(store: LogStore, directory: Path, folder: str = "") -> list[str]:
    """Copy every file below ``folder`` of ``store`` (but checksum files) into the local
    ``directory``; returns the names copied (relative to ``folder``)."""
    prefix = f"{folder.rstrip('/')}/" if folder else ""
    names = sorted(n for n in store.list_tree(folder) if not _is_checksum(n))
    _each(lambda n: fetch(store, prefix + n, directory / n), names)
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


def sha256_in(store: LogStore, name: str) -> str | None:
    """The SHA-256 of the file ``name`` of ``store``, read as a stream; None when it does
    not exist."""
    digest = hashlib.sha256()
    if isinstance(store, LocalLogStore):
        try:
            with open(store.root / name, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except FileNotFoundError:
            return None
        return digest.hexdigest()
    assert isinstance(store, S3LogStore)
    try:
        body = store.client.get_object(Bucket=store.bucket, Key=_key(store, name))["Body"]
    except store.client.exceptions.NoSuchKey:
        return None
    for chunk in body.iter_chunks(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def staging_dir(checkpoint: str, name: str) -> Iterator[Path]:
    """An empty local directory ``name`` for staging files of ``checkpoint`` (a savepoint
    of it, a restore into it), in the checkpoint's directory of this host (``exactly-job``
    of a local one), removed after the block; what a killed driver left there is removed
    when the next one starts the block (one driver at a time runs a checkpoint)."""
    directory = host_dir(checkpoint) / name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
