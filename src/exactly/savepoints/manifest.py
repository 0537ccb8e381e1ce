"""The savepoint directory and its manifest.

Layout of a savepoint ``SP``::

    SP/_metadata        the manifest (JSON), written last: a savepoint without it is incomplete
    SP/checkpoint/      Spark's checkpoint cut at the savepoint's epoch N: metadata,
                        offsets/ and commits/ N-1 and N, sources/, and for every stateful
                        operator the files that load state version N+1 and nothing newer

A savepoint is built in ``TARGET/.savepoint-<epoch>-<id>.inprogress`` and renamed to
``TARGET/savepoint-<epoch>-<id>`` once its manifest is durable, so a crash while taking one
leaves a directory every reader calls incomplete, never a half-usable savepoint. Every file
is listed in the manifest with its size and SHA-256: a truncated or altered file is found
before anything is restored from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exactly.errors import SavepointError
from exactly.fsutil import atomic_write_bytes, fsync_dir

FORMAT = "exactly-savepoint"
#: the manifest format this exactly writes and the newest it reads
FORMAT_VERSION = 1
MANIFEST = "_metadata"
CHECKPOINT_DIR = "checkpoint"
INPROGRESS_SUFFIX = ".inprogress"


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


def inprogress_dir(target: Path, epoch: int, savepoint_id: str) -> Path:
    return target / f".savepoint-{epoch}-{savepoint_id}{INPROGRESS_SUFFIX}"


def read_manifest(path: str | os.PathLike[str], *, verify_files: bool = True) -> Manifest:
    """Read and check the savepoint at ``path``.

    Raises SavepointError naming the problem and what to do: not a savepoint, incomplete
    (taken while a crash happened: take a new one), a manifest that is truncated or not
    JSON, a format version from a newer exactly, and (with ``verify_files``) a file that is
    missing, has another size or another SHA-256 than the manifest lists.
    """
    root = Path(path)
    if not root.is_dir():
        raise SavepointError(f"no savepoint at {root}: the directory does not exist")
    manifest_path = root / MANIFEST
    if root.name.endswith(INPROGRESS_SUFFIX) or not manifest_path.exists():
        raise SavepointError(
            f"{root} is an incomplete savepoint (no {MANIFEST}: the savepoint was interrupted "
            "before it completed, e.g. the driver died). It is never restored; delete it "
            "with `exactly savepoint --dispose` and take a new one")
    raw = manifest_path.read_bytes()
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
        manifest = Manifest.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise SavepointError(f"the manifest {manifest_path} lacks or mistypes a field "
                             f"({exc!r}): it is damaged") from None
    if verify_files:
        verify(root, manifest)
    return manifest


def verify(root: Path, manifest: Manifest) -> None:
    """Check every file the manifest lists (size and SHA-256); raise SavepointError."""
    for entry in manifest.files:
        path = root / entry["path"]
        if not path.is_file():
            raise SavepointError(f"the savepoint {root} lacks {entry['path']}, which its "
                                 "manifest lists: it was copied incompletely or damaged")
        size = path.stat().st_size
        if size != entry["size"] or sha256_of(path) != entry["sha256"]:
            raise SavepointError(
                f"{path} differs from the savepoint's manifest (size {size}, listed "
                f"{entry['size']}; or its SHA-256): the file was truncated or altered, so the "
                "savepoint cannot be trusted")


def dispose(path: str | os.PathLike[str]) -> Path:
    """Delete the savepoint (complete or incomplete) at ``path``; refuses other directories."""
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
