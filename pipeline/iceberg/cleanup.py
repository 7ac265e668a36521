"""Deleting the files of an Iceberg table that no snapshot references any more.

pyiceberg 0.12 expires snapshots from the metadata but deletes none of their files, and has
no orphan-file removal (neither is released yet); this module does both, by the rules of
Iceberg's Java ``ExpireSnapshots`` (``ReachableFileCleanup``) and ``DeleteOrphanFiles``:

* **Referenced** are the current metadata file and those its log lists, every remaining
  snapshot's manifest list, the manifests those list, and the live data files of those
  manifests. A referenced file is never deleted.
* **Once committed**: the manifest lists, manifests and data files of the snapshots a pass
  expired. Those not referenced any more are deleted at once. A commit in flight cannot be
  about to reference one: a commit's only old files are its parent's, its parent must be
  the table's head when it lands (the catalog checks ``AssertRefSnapshotId``), and expiry
  never removes the head; an ingester whose parent was expired meanwhile fails its commit
  and retries on the new head.
* **Orphans**: any other unreferenced file under the table's location (a commit that lost a
  race, a compaction or a process that died before committing, a file an earlier pass could
  not delete) is deleted only once older than a grace period (``orphan_grace_ms``; Iceberg's
  default is 3 days): a writer between writing its files and committing them is younger.

A reader still scanning a snapshot that expired can find a data file gone (as in Iceberg);
snapshots younger than the pass's ``keep_ms`` keep theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["StoredFile", "SweptFiles", "delete_unreferenced", "referenced_files", "stored_files"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredFile:
    """A file under a table's location, as the store lists it."""

    path: str  # without the scheme: ``bucket/key`` on S3, an absolute path locally
    size_bytes: int
    modified_ms: int | None  # None when the store does not say (never an orphan then)


@dataclass
class SweptFiles:
    """What :func:`delete_unreferenced` deleted."""

    files: int = 0
    bytes: int = 0
    orphans: int = 0  # of ``files``, those never committed or left by an earlier pass


def _key(table: Any, location: str) -> str:
    """A location as the store lists it (scheme and ``file://`` dropped)."""
    return str(table.io.parse_location(location, table.io.properties)[2])


def _filesystem(table: Any) -> tuple[Any, str]:
    """pyarrow's filesystem of the table's location, and the location's path in it."""
    scheme, netloc, path = table.io.parse_location(table.location(), table.io.properties)
    return table.io.fs_by_scheme(scheme, netloc), path


def stored_files(table: Any) -> list[StoredFile]:
    """Every file under the table's location, listed from the store."""
    from pyarrow.fs import FileSelector, FileType

    fs, root = _filesystem(table)
    infos = fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
    return [
        StoredFile(
            info.path,
            int(info.size or 0),
            int(info.mtime.timestamp() * 1000) if info.mtime is not None else None,
        )
        for info in infos
        if info.type == FileType.File
    ]


def _read(read: Callable[[], list[Any]], *, missing_ok: bool) -> list[Any]:
    """``read()``; with ``missing_ok``, nothing when its file is gone (an expired snapshot's,
    which another maintainer deleted first: what it listed is then left to the orphan rule)."""
    try:
        return read()
    except FileNotFoundError:
        if not missing_ok:
            raise
        return []


def _manifests(table: Any, snapshots: Iterable[Any], *, missing_ok: bool) -> dict[str, Any]:
    """The manifests of ``snapshots`` by path (each manifest list read once, in parallel)."""
    from pyiceberg.utils.concurrent import ExecutorFactory

    def read(snapshot: Any) -> list[Any]:
        return _read(lambda: list(snapshot.manifests(table.io)), missing_ok=missing_ok)

    found: dict[str, Any] = {}
    for manifests in ExecutorFactory.get_or_create().map(read, list(snapshots)):
        for manifest in manifests:
            found[manifest.manifest_path] = manifest
    return found


def _live_files(table: Any, manifests: Iterable[Any], *, missing_ok: bool) -> set[str]:
    """The live (added or existing) data and delete files the ``manifests`` list."""
    from pyiceberg.utils.concurrent import ExecutorFactory

    def read(manifest: Any) -> list[Any]:
        return _read(lambda: manifest.fetch_manifest_entry(table.io), missing_ok=missing_ok)

    entries = ExecutorFactory.get_or_create().map(read, list(manifests))
    return {entry.data_file.file_path for batch in entries for entry in batch}


def referenced_files(table: Any) -> set[str]:
    """Every file the table's metadata (as last loaded) references, as the store lists it.
    Raises when one of them cannot be read (then nothing may be deleted)."""
    metadata = table.metadata
    manifests = _manifests(table, metadata.snapshots, missing_ok=False)
    locations = {table.metadata_location, *(e.metadata_file for e in metadata.metadata_log)}
    locations |= {s.manifest_list for s in metadata.snapshots if s.manifest_list}
    locations |= manifests.keys()
    locations |= _live_files(table, manifests.values(), missing_ok=False)
    locations |= {f.statistics_path for f in metadata.statistics}
    locations |= {f.statistics_path for f in metadata.partition_statistics}
    return {_key(table, location) for location in locations}


def _once_committed(table: Any, expired: list[Any], referenced: set[str]) -> set[str]:
    """The files of the ``expired`` snapshots that nothing references any more."""
    lists = {s.manifest_list for s in expired if s.manifest_list}
    manifests = {
        path: manifest
        for path, manifest in _manifests(table, expired, missing_ok=True).items()
        if _key(table, path) not in referenced
    }
    found = {_key(table, loc) for loc in lists | manifests.keys()}
    found |= {_key(table, loc) for loc in _live_files(table, manifests.values(), missing_ok=True)}
    return found - referenced


def delete_unreferenced(
    table: Any, expired: list[Any], *, now_ms: int, orphan_grace_ms: int
) -> SweptFiles:
    """Delete the table's unreferenced files: those of the ``expired`` snapshots (pyiceberg
    ``Snapshot``, as loaded before the expiry) at once, any other once it is
    ``orphan_grace_ms`` old. ``table`` must be freshly loaded after the expiry. A file that
    cannot be deleted is logged and left for the next pass."""
    stored = stored_files(table)  # listed first: whatever lands later is younger
    referenced = referenced_files(table)
    once_committed = _once_committed(table, expired, referenced) if expired else set()
    orphan_before_ms = now_ms - orphan_grace_ms
    fs, _ = _filesystem(table)
    swept = SweptFiles()
    for stored_file in stored:
        if stored_file.path in referenced:
            continue
        orphan = stored_file.path not in once_committed
        if orphan and (
            stored_file.modified_ms is None or stored_file.modified_ms > orphan_before_ms
        ):
            continue
        try:
            fs.delete_file(stored_file.path)
        except FileNotFoundError:
            continue  # another maintainer, or pyiceberg's own metadata clean-up, was first
        except OSError as exc:  # bytes left behind, no harm: the next pass tries again
            log.warning("cannot delete unreferenced file %s: %s", stored_file.path, exc)
            continue
        swept.files += 1
        swept.bytes += stored_file.size_bytes
        swept.orphans += orphan
    return swept
