"""The store under a checkpoint, a sink's commit log and its lease: a local (or shared POSIX)
directory, or an S3 prefix. Both offer the four primitives exactly needs, and nothing else
is used:

=====================  =====================================  ================================
primitive              POSIX directory                        S3 (and S3-compatible stores)
=====================  =====================================  ================================
whole-file write       temp file, fsync, rename, fsync dir    PUT (atomic by itself)
create if absent       temp file, fsync, hard link            PUT ``If-None-Match: *``
compare-and-swap       ``flock`` + compare + rename           PUT ``If-Match: <ETag>``
list, read, delete     directory entries                      LIST (strongly consistent), GET
=====================  =====================================  ================================

An S3 store is named by ``s3://bucket/prefix`` (``s3a://`` too); its endpoint and
credentials come from the ``AWS_*`` environment variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), read by boto3. A store that
refuses conditional writes (``501 NotImplemented``) fails the first lease or intent write
with a ConfigError that says so: exactly does not fall back to an unconditional write.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import os
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from exactly.errors import ConfigError
from exactly.fsutil import atomic_write_bytes, create_exclusive_bytes, file_lock
from exactly.logs import log_event

logger = logging.getLogger("exactly.store")


class LogStore(ABC):
    """Files of one log, named by ``/``-separated paths relative to its root."""

    @abstractmethod
    def describe(self, name: str = "") -> str:
        """The path or URI of ``name`` (the root for ``""``), for messages."""

    @abstractmethod
    def read(self, name: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""

    @abstractmethod
    def read_versioned(self, name: str) -> tuple[bytes, str] | None:
        """The file's bytes and a token naming this version, or None."""

    @abstractmethod
    def write(self, name: str, data: bytes) -> None:
        """Replace the file whole: readers see the old or the new bytes."""

    @abstractmethod
    def create(self, name: str, data: bytes) -> bool:
        """Create the file only if it does not exist; False when it does. On S3, a create
        whose answer was lost and that was sent again is True when the object holds
        ``data``: a refusal is checked against the object, never trusted blind."""

    @abstractmethod
    def swap(self, name: str, data: bytes, token: str | None) -> bool:
        """Replace the file only if its version is still ``token`` (``None``: only if it
        does not exist); False when someone changed it since (on S3: unless the object
        holds ``data``, this swap's own write whose answer was lost)."""

    @abstractmethod
    def list(self, folder: str) -> list[str]:
        """Names of the files directly in ``folder`` (not sorted)."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove the file; a missing file is not an error."""

    @abstractmethod
    def modified(self, name: str) -> float | None:
        """When the file was last written (Unix time), or None when it does not exist."""

    @abstractmethod
    def list_tree(self, folder: str) -> builtins.list[str]:
        """Names (relative to ``folder``) of every file below ``folder``, at any depth."""

    @abstractmethod
    def stat_tree(self, folder: str) -> builtins.list[tuple[str, int, float]]:
        """``(name relative to folder, size, modified)`` of every file below ``folder``."""

    @abstractmethod
    def download(self, name: str, dest: Path) -> None:
        """Copy the file to the local file ``dest`` (its folder created); FileNotFoundError
        when it does not exist (deleted since it was listed)."""

    @abstractmethod
    def upload(self, name: str, source: Path) -> None:
        """Copy the local file ``source`` to ``name`` (replacing it): whole or not at all on
        S3, a plain copy on a POSIX directory."""

    @abstractmethod
    def sha256(self, name: str) -> str | None:
        """The file's SHA-256, read as a stream; None when it does not exist."""

    @abstractmethod
    def any(self) -> bool:
        """Whether anything is stored under the root."""

    def exists(self, name: str) -> bool:
        return self.read(name) is not None


def open_log_store(location: str | Path) -> LogStore:
    """The store of a log ``location``: ``s3://`` / ``s3a://`` URIs are S3 prefixes,
    ``file://`` URIs and plain paths local directories. Raises ConfigError for another
    scheme."""
    text = str(location)
    if text.startswith(("s3://", "s3a://")):
        return S3LogStore(text)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        raise ConfigError(f"{text}: a sink's commit log needs a local or shared POSIX "
                          "directory or an s3:// prefix")
    return LocalLogStore(Path(text))


def is_remote(location: str | os.PathLike[str]) -> bool:
    """True for an ``s3://`` or ``s3a://`` location."""
    return str(location).startswith(("s3://", "s3a://"))


class LocalLogStore(LogStore):
    """A directory: atomic renames, hard links for create-if-absent, ``flock`` for swaps."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def describe(self, name: str = "") -> str:
        return str(self.root / name) if name else str(self.root)

    def read(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def read_versioned(self, name: str) -> tuple[bytes, str] | None:
        data = self.read(name)
        return None if data is None else (data, hashlib.sha256(data).hexdigest())

    def write(self, name: str, data: bytes) -> None:
        atomic_write_bytes(self.root / name, data)

    def create(self, name: str, data: bytes) -> bool:
        return create_exclusive_bytes(self.root / name, data)

    def lock_file(self, name: str) -> Path:
        """The lock file that :meth:`swap` holds while it swaps ``name`` (``lease.json``:
        ``lease.lock``); it stays after the swap."""
        folder, _, base = name.rpartition("/")
        return self.root / folder / f"{base.rsplit('.', 1)[0]}.lock"

    def swap(self, name: str, data: bytes, token: str | None) -> bool:
        with file_lock(self.lock_file(name)):
            current = self.read_versioned(name)
            if (current[1] if current else None) != token:
                return False
            self.write(name, data)
            return True

    def list(self, folder: str) -> list[str]:
        directory = self.root / folder
        if not directory.is_dir():
            return []
        return [p.name for p in directory.iterdir()
                if p.is_file() and not p.name.endswith((".lock", ".tmp"))]

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def modified(self, name: str) -> float | None:
        try:
            return (self.root / name).stat().st_mtime
        except FileNotFoundError:
            return None

    def list_tree(self, folder: str) -> builtins.list[str]:
        directory = self.root / folder
        if not directory.is_dir():
            return []
        return [str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()]

    def stat_tree(self, folder: str) -> builtins.list[tuple[str, int, float]]:
        found = []
        for name in self.list_tree(folder):
            try:
                stat = (self.root / folder / name).stat()
            except FileNotFoundError:
                continue
            found.append((name, stat.st_size, stat.st_mtime))
        return found

    def download(self, name: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / name, dest)

    def upload(self, name: str, source: Path) -> None:
        target = self.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)

    def sha256(self, name: str) -> str | None:
        digest = hashlib.sha256()
        try:
            with open(self.root / name, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except FileNotFoundError:
            return None
        return digest.hexdigest()

    def any(self) -> bool:
        return self.root.exists()


class S3LogStore(LogStore):
    """An S3 prefix through boto3, with conditional PUTs for create-if-absent and swaps.

    ``read_timeout``: seconds a request waits for the store's answer before boto3 gives
    up on it and sends it again (up to 5 attempts in all); botocore's 60 s when None."""

    def __init__(self, uri: str, *, read_timeout: float | None = None) -> None:
        self.scheme, _, rest = uri.partition("://")
        rest = rest.strip("/")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ConfigError(f"{uri}: name a bucket, s3://BUCKET/PREFIX")
        self.bucket = bucket
        self.prefix = prefix
        self.read_timeout = read_timeout
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:  # a client does not travel to other processes
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            timeouts = {} if self.read_timeout is None else {"read_timeout": self.read_timeout}
            self._client = boto3.client(
                "s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
                config=Config(s3={"addressing_style": "path"},
                              retries={"max_attempts": 5, "mode": "standard"}, **timeouts))
        return self._client

    def key(self, name: str) -> str:
        """The object key of ``name``."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def describe(self, name: str = "") -> str:
        key = self.key(name) if name else self.prefix
        return f"{self.scheme}://{self.bucket}/{key}"

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key(name))
        except self.client.exceptions.NoSuchKey:
            return None

    def read(self, name: str) -> bytes | None:
        found = self.read_versioned(name)
        return None if found is None else found[0]

    def read_versioned(self, name: str) -> tuple[bytes, str] | None:
        response = self._get(name)
        if response is None:
            return None
        return response["Body"].read(), response["ETag"]

    def write(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def _put_if(self, name: str, data: bytes, **condition: str) -> bool:
        """PUT ``data`` under ``condition``; True when the object holds ``data`` after it.

        The ambiguous commit: a conditional PUT whose answer was lost (a reset connection,
        a read timeout) after the store applied it is sent again by boto3's retries, and
        the repeat is refused (412: the object is no longer absent, its ETag no longer the
        one named). A refusal is therefore never taken as "someone else won" before the
        object is read back: holding exactly ``data``, it is this call's write (or one
        with the same bytes: the same outcome), and the answer is True."""
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data,
                                   **condition)
            return True
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409,
                                                                                           412):
                return self._holds(name, data, exc)
            if code == "NoSuchKey" and "IfMatch" in condition:
                return False  # swapped against a version that was deleted since
            if code == "NotImplemented" or status == 501:
                raise ConfigError(
                    f"{self.describe(name)}: this S3 store refuses conditional writes "
                    "(If-None-Match / If-Match), which the commit log and the lease need to be "
                    "safe with two drivers; use a store that has them (AWS S3, MinIO, "
                    "S3Proxy >= 3) or keep exactly.logDir on a shared POSIX directory") from None
            raise

    def _holds(self, name: str, data: bytes, refusal: Exception) -> bool:
        """After a refused conditional PUT: whether the object holds ``data`` (an earlier
        attempt of the same PUT stored it); logged when it does."""
        found = self.read(name)
        if found != data:
            return False
        attempts = getattr(refusal, "response", {}).get("ResponseMetadata", {}).get(
            "RetryAttempts")
        log_event(logger, "conditional_put_resolved", logging.WARNING,
                  object=self.describe(name), retries=attempts,
                  detail="the store refused the PUT but holds its bytes: an earlier attempt "
                         "whose answer was lost stored it")
        return True

    def create(self, name: str, data: bytes) -> bool:
        return self._put_if(name, data, IfNoneMatch="*")

    def swap(self, name: str, data: bytes, token: str | None) -> bool:
        if token is None:
            return self.create(name, data)
        return self._put_if(name, data, IfMatch=token)

    def list(self, folder: str) -> list[str]:
        return self._list(folder, Delimiter="/")

    def list_tree(self, folder: str) -> builtins.list[str]:
        return self._list(folder)

    def stat_tree(self, folder: str) -> builtins.list[tuple[str, int, float]]:
        prefix = self.key(folder).rstrip("/") + "/" if folder or self.prefix else ""
        found = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                if not obj["Key"].endswith("/"):
                    found.append((obj["Key"][len(prefix):], int(obj["Size"]),
                                  float(obj["LastModified"].timestamp())))
        return found

    def modified(self, name: str) -> float | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(name))
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise
        return float(head["LastModified"].timestamp())

    def download(self, name: str, dest: Path) -> None:
        from botocore.exceptions import ClientError

        dest.parent.mkdir(parents=True, exist_ok=True)
        try:  # a managed transfer: multipart for big files
            self.client.download_file(self.bucket, self.key(name), str(dest))
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code")
            if status == 404 or code in ("404", "NoSuchKey"):
                raise FileNotFoundError(2, "no such object", self.describe(name)) from None
            raise

    def upload(self, name: str, source: Path) -> None:
        self.client.upload_file(str(source), self.bucket, self.key(name))

    def sha256(self, name: str) -> str | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"]
        except self.client.exceptions.NoSuchKey:
            return None
        digest = hashlib.sha256()
        for chunk in body.iter_chunks(1 << 20):
            digest.update(chunk)
        return digest.hexdigest()

    def any(self) -> bool:
        prefix = self.prefix.rstrip("/") + "/" if self.prefix else ""
        found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=1)
        return bool(found.get("KeyCount"))

    def _list(self, folder: str, **delimiter: str) -> builtins.list[str]:
        prefix = self.key(folder).rstrip("/") + "/"
        names: builtins.list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, **delimiter):
            names.extend(obj["Key"][len(prefix):] for obj in page.get("Contents", [])
                         if not obj["Key"].endswith("/"))  # directory markers of other tools
        return names

    def delete(self, name: str) -> None:
        with contextlib.suppress(self.client.exceptions.NoSuchKey):
            self.client.delete_object(Bucket=self.bucket, Key=self.key(name))


