"""Object-store locations for the audit: opened with the sinks' settings, errors named by
the setting to fix.

A location ``s3://bucket/prefix`` (or ``s3a://``) is opened with
:class:`exactly.objectstore.Location`: its storage options are the ``AWS_*`` environment
variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``), as for the Delta sink and the
S3 commit log, and the same cached PyArrow S3 client. What the store answers is classified:

* a bad setting (an endpoint that is not a URL, plain http without ``AWS_ALLOW_HTTP``), a
  bucket that does not exist, credentials missing or refused: :class:`AuditInputError`
  naming the setting (exit 2); secrets are never part of a message;
* an endpoint that cannot be reached: :class:`ObjectStoreUnreachable` (the audit failed,
  exit 3), naming ``AWS_ENDPOINT_URL``;
* anything else: the store's own error, unchanged.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs

from exactly.errors import AuditInputError, ConfigError, ExactlyError
from exactly.objectstore import Location

#: object-store schemes a location may have (``s3a://`` is Hadoop's name of ``s3://``)
SCHEMES = ("s3", "s3a")
_AWS_CODE = re.compile(r"AWS Error (\w+)")
_REFUSED = ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH",
            "MISSING_AUTHENTICATION_TOKEN", "EXPIRED_TOKEN", "INVALID_CLIENT_TOKEN_ID",
            "UNRECOGNIZED_CLIENT")
_UNREACHABLE = ("NETWORK_CONNECTION", "REQUEST_TIMEOUT", "SERVICE_UNAVAILABLE")


class ObjectStoreUnreachable(ExactlyError):
    """The object store's endpoint did not answer (the audit fails with exit 3)."""


@dataclass(frozen=True)
class Store:
    """A location opened (an object store's or a local directory): ``fs`` and the
    location's ``path`` inside it."""

    location: Location
    fs: pafs.FileSystem
    path: str

    @property
    def uri(self) -> str:
        return self.location.uri

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]

    def child(self, name: str) -> str:
        return f"{self.path}/{name}" if name else self.path


def is_object_uri(text: str) -> bool:
    """Whether ``text`` names an object-store location (``s3://``, ``s3a://``)."""
    return "://" in text and text.split("://", 1)[0].lower() in SCHEMES


def open_store(uri: str, what: str) -> Store:
    """Open ``uri`` (an object-store URI with the ``AWS_*`` settings, or a local path);
    AuditInputError for a setting that cannot work or a URI without a bucket. Makes no
    request."""
    if is_object_uri(uri) and not uri.split("://", 1)[1].split("/", 1)[0]:
        raise AuditInputError(f"{what}: {uri!r} names no bucket; write s3://BUCKET/prefix")
    location = Location.parse(uri)
    try:
        fs, path = location.filesystem()
    except ConfigError as exc:
        raise AuditInputError(f"{what}: {location.uri}: {exc}") from None
    return Store(location, fs, path)


@contextlib.contextmanager
def store_errors(store: Store, what: str) -> Iterator[None]:
    """Translate the store's errors inside the block (see the module docstring)."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        text = str(exc)
        match = _AWS_CODE.search(text)
        code = match.group(1) if match else ""
        options = {k.upper(): v for k, v in store.location.resolved_options().items()}
        endpoint = options.get("AWS_ENDPOINT_URL") or options.get("AWS_ENDPOINT")
        at = (f"AWS_ENDPOINT_URL={endpoint}" if endpoint
              else "AWS's default endpoint (AWS_ENDPOINT_URL is not set)")
        if code == "NO_SUCH_BUCKET":
            raise AuditInputError(f"{what}: bucket {store.bucket!r} of {store.uri} does not "
                                  f"exist at {at}; check the bucket name and "
                                  "AWS_ENDPOINT_URL") from None
        if code in _REFUSED or "HTTP status 403" in text:
            given = ("refused the credentials of AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
                     if options.get("AWS_ACCESS_KEY_ID")
                     else "needs credentials and none were given")
            raise AuditInputError(f"{what}: {store.uri}: the store at {at} {given} "
                                  f"({code or 'access denied'}); set AWS_ACCESS_KEY_ID and "
                                  "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
                                  "temporary credentials) to a key that may read it") from None
        if code in _UNREACHABLE or "curlCode" in text:
            detail = text.split(" operation: ", 1)[-1]
            raise ObjectStoreUnreachable(f"cannot reach the object store for {store.uri} at "
                                         f"{at}: {detail}; check AWS_ENDPOINT_URL and that "
                                         "the server is up") from None
        raise


def probe(store: Store, what: str) -> pafs.FileType:
    """The type of the location (File or Directory); AuditInputError when nothing is
    there, naming a missing bucket apart from an empty prefix."""
    with store_errors(store, what):
        kind = store.fs.get_file_info(store.path).type
        if kind != pafs.FileType.NotFound:
            return kind
        # a HEAD does not tell a missing bucket from a missing key: a listing does
        with contextlib.suppress(FileNotFoundError):
            store.fs.get_file_info(pafs.FileSelector(store.path))
    raise AuditInputError(f"{what}: {store.uri} holds no objects; check the prefix (and the "
                          "bucket, AWS_ENDPOINT_URL)")


def has_delta_log(store: Store, what: str) -> bool:
    """Whether the location holds a Delta log (objects under ``_delta_log/``)."""
    with store_errors(store, what):
        return store.fs.get_file_info(store.child("_delta_log")).type == pafs.FileType.Directory
