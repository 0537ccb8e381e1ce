"""Where a checkpoint is: a local (or shared POSIX) directory, or an S3 prefix.

Every command and process names a checkpoint by :func:`checkpoint_uri`: an absolute local
path, or ``s3a://bucket/prefix`` (Spark's S3A name; ``s3://`` is accepted and written as
``s3a://``). No other string is ever turned into a local directory: a URI of another scheme
is refused with :class:`~exactly.errors.ConfigError`, so ``s3a://lake/ck`` can never become a
local directory named ``s3a:``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from exactly.checkpoint import layout
from exactly.checkpoint.store import LocalLogStore, LogStore, S3LogStore, is_remote
from exactly.checkpoint.transfer import delete_tree
from exactly.errors import ConfigError


def checkpoint_uri(location: str | os.PathLike[str]) -> str:
    """The checkpoint as every process names it: ``s3a://bucket/prefix`` or an absolute
    local path (``file:`` URIs and relative paths resolved). Raises ConfigError for another
    scheme or an S3 URI without a bucket."""
    text = os.fspath(location).strip()
    if not text:
        raise ConfigError("no checkpoint given: name a local directory or an "
                          "s3a://bucket/prefix")
    if is_remote(text):
        rest = text.split("://", 1)[1].strip("/")
        bucket, _, prefix = rest.partition("/")
        if not bucket or not prefix:
            raise ConfigError(f"checkpoint {text}: name a bucket and a prefix, "
                              "s3a://BUCKET/PREFIX (a job's checkpoint is never a whole "
                              "bucket)")
        return f"s3a://{bucket}/{prefix}"
    local = local_checkpoint(text)
    if local is None:
        scheme = text.split("://", 1)[0]
        raise ConfigError(f"checkpoint {text}: exactly keeps checkpoints on a local or shared "
                          f"POSIX directory or on S3 (s3a://bucket/prefix), not on {scheme}://")
    return str(local.absolute())


def location_uri(location: str | os.PathLike[str], what: str = "location") -> str:
    """A place outside a checkpoint (a savepoint, a savepoint directory) as exactly names it:
    ``s3://bucket/prefix`` (``s3a://`` accepted) or an absolute local path. Raises
    ConfigError for another scheme."""
    text = os.fspath(location).strip()
    if is_remote(text):
        rest = text.split("://", 1)[1].strip("/")
        if not rest.partition("/")[0]:
            raise ConfigError(f"{what} {text}: name a bucket, s3://BUCKET/PREFIX")
        return f"s3://{rest}"
    local = local_checkpoint(text) if text else None
    if local is None:
        raise ConfigError(f"{what} {text!r}: give a local directory or an s3://bucket/prefix")
    return str(local.absolute())


def same_place(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two checkpoints or savepoints are the same place (``s3a://`` is ``s3://``,
    a local path is compared resolved)."""
    def norm(place: str | os.PathLike[str]) -> str:
        text = os.fspath(place)
        return location_uri(text) if is_remote(text) else str(Path(text).resolve())

    return norm(a) == norm(b)


def local_checkpoint(location: str | os.PathLike[str]) -> Path | None:
    """The local directory of a checkpoint location (``/p``, ``file:/p``, ``file:///p``);
    ``None`` for other file systems (s3a://, hdfs://, ...)."""
    text = os.fspath(location)
    if text.startswith("file://"):
        return Path(text[len("file://"):])
    if text.startswith("file:"):
        return Path(text[len("file:"):])
    if "://" in text:
        return None
    return Path(text)


def open_store(location: str | os.PathLike[str], *parts: str) -> LogStore:
    """The store of ``location`` (a checkpoint or a folder below it named by ``parts``)."""
    text = os.fspath(location)
    if is_remote(text):
        return S3LogStore(layout.join(text, *parts))
    local = local_checkpoint(text)
    if local is None:
        raise ConfigError(f"{text}: not a local directory or an s3a:// prefix")
    return LocalLogStore(local.joinpath(*parts).absolute())


def job_store(checkpoint: str | os.PathLike[str]) -> LogStore:
    """``<checkpoint>/exactly-job``: where exactly keeps a job's control files, status,
    restart log and history."""
    return open_store(checkpoint, layout.JOB_DIR)


def job_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """``<checkpoint>/exactly-job`` of a local checkpoint, as a directory."""
    local = local_checkpoint(os.fspath(checkpoint))
    if local is None:
        raise ConfigError(f"{checkpoint}: not a local checkpoint (use job_store for S3)")
    return local.absolute() / layout.JOB_DIR


def as_store(where: LogStore | str | os.PathLike[str]) -> LogStore:
    """A store given as one, or a local directory path."""
    if isinstance(where, LogStore):
        return where
    return open_store(where)


def delete_checkpoint(checkpoint: str | os.PathLike[str]) -> None:
    """Delete everything stored under the checkpoint (``externalized_cleanup =
    delete_on_cancellation``); a checkpoint that is gone is not an error."""
    delete_tree(open_store(checkpoint))


def checkpoint_exists(checkpoint: str | os.PathLike[str]) -> bool:
    """Whether anything is stored under the checkpoint (a local directory that exists, or
    an S3 prefix with at least one object)."""
    return open_store(checkpoint).any()


def host_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """A local directory for the files that only the processes of this host use for the job
    (the pacer's admission file, a fault's marker): ``<checkpoint>/exactly-job`` of a local
    checkpoint; for a checkpoint on S3, a directory of this host named after it."""
    if not is_remote(checkpoint):
        return job_dir(checkpoint)
    digest = hashlib.sha256(checkpoint_uri(checkpoint).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"exactly-{os.getuid()}" / digest
