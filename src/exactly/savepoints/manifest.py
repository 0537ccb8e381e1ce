"""The savepoint directory and its manifest.

Layout of a savepoint ``SP`` (a local directory or an S3 prefix ``s3://bucket/prefix``)::

    SP/_metadata        the manifest (JSON), written last: a savepoint without it is incomplete
    SP/checkpoint/      Spark's checkpoint cut at the savepoint's epoch N: metadata,
                        offsets/ and commits/ N-1 and N, sources/, and for every stateful
                        operator the files that load state version N+1 and nothing newer

A savepoint is built in ``TARGET/.savepoint-<epoch>-<id>.inprogress`` and renamed to
``TARGET/savepoint-<epoch>-<id>`` once its manifest is durable, so a crash while taking one
leaves a directory every reader calls incomplete, never a half-usable savepoint. On S3,
where nothing renames atomically, a savepoint is uploaded straight to
``TARGET/savepoint-<epoch>-<id>/`` with its manifest last (a PUT that only creates it): an
interrupted upload leaves a prefix without ``_metadata``, which every reader calls
incomplete too. Every file is listed in the manifest with its size and SHA-256: a truncated
or altered file is found before anything is restored from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exactly.checkpoint.location import location_uri, open_store
from exactly.checkpoint.store import LogStore, is_remote
from exactly.checkpoint.transfer import delete_tree, put_all
from exactly.errors import SavepointError
from exactly.fsutil import atomic_write_bytes, fsync_dir

FORMAT = "exactly-savepoint"
#: the manifest format this exactly writes and the newest it reads
FORMAT_VERSION = 1
MANIFEST = "_metadata"
CHECKPOINT_DIR = "checkpoint"
INPROGRESS_SUFFIX = ".inprogress"
#: the name of a savepoint (its directory or S3 prefix)
SAVEPOINT_NAME = re.compile(r"^savepoint-\d+-[0-9a-f]+$")


@dataclass
class StoreInfo:
    """One state store of an operator: its schemas and what the savepoint holds of it."""

    name: str
    key_schema: str = ""
    value_schema: str = ""
    rows: int = 0
    bytes: int = 0


@dataclass
class OperatorInfo:
    """A stateful operator in a savepoint: Spark's positional id and the user's uid."""

    operator_id: int
    name: str
    partitions: int
    uid: str | None = None
    stores: list[StoreInfo] = field(default_factory=list)
    #: metadata version of Spark's operator metadata (1: aggregates, dedup; 2: transformWithState)
    metadata_version: int = 1

    @property
    def label(self) -> str:
        return self.uid if self.uid is not None else f"#{self.operator_id} ({self.name})"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OperatorInfo:
        stores = [StoreInfo(**s) for s in data.get("stores", [])]
        return cls(operator_id=int(data["operator_id"]), name=str(data["name"]),
                   partitions=int(data["partitions"]), uid=data.get("uid"), stores=stores,
                   metadata_version=int(data.get("metadata_version", 1)))


@dataclass
class SinkInfo:
    """The sink a savepoint's job wrote to, and its last epoch visible there."""

    format: str
    target: str | None
    committed_epoch: int | None


@dataclass
class Manifest:
    """What ``_metadata`` says; see the module docstring for the layout."""

    savepoint_id: str
    epoch: int
    created_at: str
    query_id: str
    #: "savepoint" (the job kept running) | "stop" (stop-with-savepoint) | "checkpoint" (staged
    #: from a retained checkpoint by ``-s CHECKPOINT``)
    trigger: str
    spark_version: str
    shuffle_partitions: int
    state_backend: str  # hashmap | rocksdb
    sql_conf: dict[str, str]
    sources: list[dict[str, Any]]
    operators: list[OperatorInfo]
    sinks: list[SinkInfo]
    job: dict[str, Any]
    files: list[dict[str, Any]] = field(default_factory=list)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        values = dict(data)
        values["operators"] = [OperatorInfo.from_json(o) for o in data.get("operators", [])]
        values["sinks"] = [SinkInfo(**s) for s in data.get("sinks", [])]
        return cls(**values)

    def operator(self, uid_or_id: str | int) -> OperatorInfo | None:
        for op in self.operators:
            if op.uid == uid_or_id or op.operator_id == uid_or_id:
                return op
        return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def list_files(root: Path) -> list[dict[str, Any]]:
    """Every file under ``root`` (but the manifest) with its size and SHA-256."""
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative == MANIFEST:
            continue
        files.append({"path": relative, "size": path.stat().st_size, "sha256": sha256_of(path)})
    return files


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """List the directory's files into ``manifest`` and write it last, atomically."""
    manifest.files = list_files(directory)
    data = json.dumps(manifest.to_json(), indent=2, sort_keys=True).encode()
    atomic_write_bytes(directory / MANIFEST, data)


def publish(inprogress: Path) -> Path:
    """Rename a complete ``.inprogress`` directory to its final name; returns it."""
    final = inprogress.parent / inprogress.name.lstrip(".").removesuffix(INPROGRESS_SUFFIX)
    if final.exists():
        raise SavepointError(f"{final} exists already: a savepoint never overwrites another")
    os.rename(inprogress, final)
    fsync_dir(final.parent)
    return final


def upload_savepoint(work: Path, target: str,
                     before_manifest: Callable[[], object] | None = None) -> str:
    """Upload the complete local savepoint ``work`` (its ``.inprogress`` directory) to
    ``target/savepoint-<epoch>-<id>`` on S3, every file first and the manifest last, created
    only if absent; returns its URI. ``before_manifest`` runs between the two (a crash
    point). Interrupted, it leaves a prefix without manifest: an incomplete savepoint."""
    name = work.name.lstrip(".").removesuffix(INPROGRESS_SUFFIX)
    uri = f"{location_uri(target).rstrip('/')}/{name}"
    store = open_store(uri)
    if store.exists(MANIFEST):
        raise SavepointError(f"{uri} exists already: a savepoint never overwrites another")
    names = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    put_all(store, work, [n for n in names if n != MANIFEST])
    if before_manifest is not None:
        before_manifest()
    if not store.create(MANIFEST, (work / MANIFEST).read_bytes()):
        raise SavepointError(f"{uri} exists already: a savepoint never overwrites another")
    return uri


def inprogress_dir(target: Path, epoch: int, savepoint_id: str) -> Path:
    return target / f".savepoint-{epoch}-{savepoint_id}{INPROGRESS_SUFFIX}"


def read_manifest(path: str | os.PathLike[str], *, verify_files: bool = True,
                  checksums: bool = True) -> Manifest:
    """Read and check the savepoint at ``path`` (a local directory or ``s3://``).

    Raises SavepointError naming the problem and what to do: not a savepoint, incomplete
    (taken while a crash happened: take a new one), a manifest that is truncated or not
    JSON, a format version from a newer exactly, and (with ``verify_files``) a file that is
    missing, has another size or (with ``checksums``; read whole, as a stream on S3) another
    SHA-256 than the manifest lists.
    """
    if is_remote(path):
        uri = location_uri(path)
        store = open_store(uri)
        raw = store.read(MANIFEST)
        if raw is None:
            if not store.any():
                raise SavepointError(f"no savepoint at {uri}: nothing is stored there")
            raise _incomplete(uri)
        manifest = _parse(raw, store.describe(MANIFEST), uri)
        if verify_files:
            _verify(uri, store, manifest, checksums)
        return manifest
    root = Path(path)
    if not root.is_dir():
        raise SavepointError(f"no savepoint at {root}: the directory does not exist")
    manifest_path = root / MANIFEST
    if root.name.endswith(INPROGRESS_SUFFIX) or not manifest_path.exists():
        raise _incomplete(str(root))
    manifest = _parse(manifest_path.read_bytes(), str(manifest_path), str(root))
    if verify_files:
        _verify(str(root), open_store(root), manifest, checksums)
    return manifest


def _incomplete(where: str) -> SavepointError:
    return SavepointError(
        f"{where} is an incomplete savepoint (no {MANIFEST}: the savepoint was interrupted "
        "before it completed, e.g. the driver died). It is never restored; delete it "
        "with `exactly savepoint --dispose` and take a new one")


def _parse(raw: bytes, manifest_path: str, root: str) -> Manifest:
    """The manifest in ``raw`` (the bytes of ``manifest_path``), checked."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SavepointError(
            f"the manifest {manifest_path} is damaged ({len(raw)} bytes, not JSON: {exc}); the "
            "savepoint cannot be trusted: restore another savepoint or checkpoint") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SavepointError(f"{manifest_path} is not the manifest of an exactly savepoint "
                             f"(format {data.get('format') if isinstance(data, dict) else None!r}"
                             f", expected {FORMAT!r})")
    version = data.get("format_version")
    if not isinstance(version, int):
        raise SavepointError(f"{manifest_path} has no format_version: it is damaged")
    if version > FORMAT_VERSION:
        raise SavepointError(
            f"the savepoint {root} has format version {version}, written by a newer exactly; "
            f"this exactly reads versions up to {FORMAT_VERSION}: upgrade exactly to restore it")
    try:
        return Manifest.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise SavepointError(f"the manifest {manifest_path} lacks or mistypes a field "
                             f"({exc!r}): it is damaged") from None


def verify(root: Path, manifest: Manifest) -> None:
    """Check every file the manifest lists (size and SHA-256); raise SavepointError."""
    _verify(str(root), open_store(root), manifest, True)


def _verify(root: str, store: LogStore, manifest: Manifest, checksums: bool) -> None:
    sizes = {name: size for name, size, _ in store.stat_tree("")}
    for entry in manifest.files:
        size = sizes.get(entry["path"])
        if size is None:
            raise SavepointError(f"the savepoint {root} lacks {entry['path']}, which its "
                                 "manifest lists: it was copied incompletely or damaged")
        if size != entry["size"] or (checksums and
                                     store.sha256(entry["path"]) != entry["sha256"]):
            raise SavepointError(
                f"{store.describe(entry['path'])} differs from the savepoint's manifest (size "
                f"{size}, listed {entry['size']}; or its SHA-256): the file was truncated or "
                "altered, so the savepoint cannot be trusted")


def dispose(path: str | os.PathLike[str]) -> Path | str:
    """Delete the savepoint (complete or incomplete) at ``path``, a local directory or an S3
    prefix; refuses what is not a savepoint. On S3 the manifest goes first, so a deletion
    that is interrupted leaves an incomplete savepoint, never a complete-looking one that
    lacks files."""
    if is_remote(path):
        uri = location_uri(path)
        store = open_store(uri)
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        if "/" not in uri[len("s3://"):] or not store.any():
            raise SavepointError(f"no savepoint at {uri}")
        if not store.exists(MANIFEST) and not SAVEPOINT_NAME.match(name):
            raise SavepointError(f"{uri} is not a savepoint (no {MANIFEST}, not named "
                                 "savepoint-<epoch>-<id>): not deleting it")
        delete_tree(store, first=[MANIFEST])
        return uri
    root = Path(path)
    if not root.is_dir():
        raise SavepointError(f"no savepoint at {root}")
    if not (root / MANIFEST).exists() and not root.name.endswith(INPROGRESS_SUFFIX):
        raise SavepointError(f"{root} is not a savepoint (no {MANIFEST}, not an "
                             f"{INPROGRESS_SUFFIX} directory): not deleting it")
    shutil.rmtree(root)
    fsync_dir(root.parent)
    return root


def incomplete_savepoints(target: Path) -> list[Path]:
    """Directories under ``target`` left by savepoints that never completed."""
    if not target.is_dir():
        return []
    return sorted(p for p in target.iterdir() if p.name.endswith(INPROGRESS_SUFFIX))
