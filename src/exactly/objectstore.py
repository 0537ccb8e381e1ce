"""Locations on a local disk or an object store, as one PyArrow file system plus a path.

A location is a URI (``s3://bucket/prefix``, ``s3a://...``, ``file:///dir``, a plain local
path, or any other scheme PyArrow's ``FileSystem.from_uri`` knows) and *storage options*: the
keys the ``deltalake`` package takes (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``, ...).
For S3 the options are merged over the same ``AWS_*`` environment variables, so the data
files exactly writes with PyArrow and the commits ``deltalake`` writes go to the same
endpoint with the same credentials.

What each store offers the protocol (see docs/scale-out.md): every store here writes an
object atomically (a reader sees all of it or nothing) and lists by prefix. None of them
renames atomically; S3 (and s3proxy >= 3) creates an object only if absent
(``If-None-Match: *``), which ``deltalake`` uses for its commits.

Secrets are never part of ``repr`` or of any message.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import ParseResult, urlparse

import pyarrow.fs as pafs

from exactly.errors import ConfigError

#: storage option keys (upper case) that configure S3, and the environment variables of the
#: same names they default to
S3_KEYS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
           "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP")
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "KEY_ID")


def _is_secret(key: str) -> bool:
    return any(word in key.upper() for word in _SECRET_WORDS)


@dataclass(frozen=True)
class Location:
    """A directory-like place: ``uri`` as the user gave it (normalised) and its options."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, uri: str, storage_options: Mapping[str, str] | None = None) -> Location:
        """Normalise ``uri``: local paths become absolute, ``file://`` is dropped and
        ``s3a://`` (Hadoop's name) becomes ``s3://``. Raises ConfigError on an empty one."""
        if not uri or not uri.strip():
            raise ConfigError("no location given: set the path (a local directory or an "
                              "s3://bucket/prefix URI)")
        uri = uri.strip()
        if uri.startswith("file://"):
            uri = uri[len("file://"):]
        if "://" not in uri:
            uri = os.path.abspath(uri)
        elif uri.startswith("s3a://"):
            uri = "s3://" + uri[len("s3a://"):]
        opts = {str(k): str(v) for k, v in (storage_options or {}).items()}
        return cls(uri.rstrip("/") or "/", opts)

    @property
    def scheme(self) -> str:
        return urlparse(self.uri).scheme if "://" in self.uri else "file"

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def child(self, *parts: str) -> str:
        """The URI of ``parts`` below this location."""
        return "/".join([self.uri, *parts])

    def resolved_options(self) -> dict[str, str]:
        """The storage options with the S3 environment variables filled in (S3 only): what
        ``deltalake`` gets, so it and PyArrow use one endpoint and one set of credentials."""
        opts = dict(self.storage_options)
        if self.scheme == "s3":
            upper = {k.upper() for k in opts}
            for key in S3_KEYS:
                if key not in upper and os.environ.get(key):
                    opts[key] = os.environ[key]
        return opts

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """``(file system, path of this location inside it)``.

        Raises ConfigError naming the problem for a URI PyArrow cannot open.
        """
        if self.is_local:
            return pafs.LocalFileSystem(), self.uri
        if self.scheme == "s3":
            options = tuple(sorted(self.resolved_options().items()))
            return _s3_filesystem(options), self.uri[len("s3://"):]
        try:
            fs, path = pafs.FileSystem.from_uri(self.uri)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise ConfigError(f"cannot open {self.uri!r} ({exc}); use a local path or an "
                              "s3:// URI") from None
        return fs, path

    def __repr__(self) -> str:
        shown = {k: ("***" if _is_secret(k) else v) for k, v in self.storage_options.items()}
        return f"Location({self.uri!r}, {shown})"


def checked_endpoint(endpoint: str, allow_http: str | None) -> ParseResult:
    """``AWS_ENDPOINT_URL`` parsed; ConfigError unless it is an http(s) URL, and a plain
    ``http://`` one only with ``AWS_ALLOW_HTTP=true``."""
    parsed = urlparse(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"AWS_ENDPOINT_URL={endpoint!r} is not an http(s) URL such as "
                          "http://127.0.0.1:9000")
    if parsed.scheme == "http" and (allow_http or "").lower() != "true":
        raise ConfigError(f"AWS_ENDPOINT_URL={endpoint!r} is plain http: set "
                          "AWS_ALLOW_HTTP=true to allow it (test servers only)")
    return parsed


@functools.lru_cache(maxsize=16)
def _s3_filesystem(options: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    """One S3 client per set of settings and process: a sink opens its location for every
    marker, file and check, and a new client resolves its credentials again."""
    opts = {k.upper(): v for k, v in options}
    kwargs: dict[str, object] = {}
    endpoint = opts.get("AWS_ENDPOINT_URL") or opts.get("AWS_ENDPOINT")
    if endpoint:
        parsed = checked_endpoint(endpoint, opts.get("AWS_ALLOW_HTTP"))
        kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
        kwargs["scheme"] = parsed.scheme
    if opts.get("AWS_ACCESS_KEY_ID"):
        kwargs["access_key"] = opts["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = opts.get("AWS_SECRET_ACCESS_KEY", "")
        if opts.get("AWS_SESSION_TOKEN"):
            kwargs["session_token"] = opts["AWS_SESSION_TOKEN"]
    region = opts.get("AWS_REGION") or opts.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)
