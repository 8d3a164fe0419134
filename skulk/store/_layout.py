"""The store's on-disk layout (see the package doc) and opening it after a crash."""

from __future__ import annotations

import shutil
from pathlib import Path

import attrs

from skulk.models import ManifestInvalid, decode_manifest, manifest_sha256
from skulk.store._index import (
    EMPTY,
    INDEX_VERSION,
    Index,
    IndexEntry,
    is_sha256_hex,
    read_index,
    write_index,
)
from skulk.wire.transfer import Manifest

#: The canonical manifest bytes kept in every model directory (they hash to its name).
MANIFEST_NAME = ".skulk-manifest.cbor"
INDEX_NAME = "index.cbor"
#: Staging directories of imports (which never resume: they are deleted on opening; so are
#: discarded ones, renamed ``.gone-*``).
IMPORT_PREFIX = "import-"


def blob_sizes(manifest: Manifest) -> dict[str, int]:
    """The distinct blobs (sha256 hex) of a manifest and their sizes."""
    return {f.sha256.hex(): f.size for f in manifest.files}


@attrs.frozen
class Recovered:
    index: Index
    manifests: dict[str, Manifest]
    loose: dict[str, int]
    """Blobs no stored model uses, with their sizes."""


def recover(root: Path) -> Recovered:
    """Open the layout under ``root`` (created if absent) and repair what a crash left:
    model directories that are incomplete (half built, half removed, a blob gone) or not named
    by their manifest's hash are deleted, as are import staging directories; the index forgets
    models whose directory is gone and adopts complete ones it does not list (no names, never
    used: the first to evict); a damaged index is rebuilt from the directories."""
    blobs, models, staging = root / "blobs", root / "models", root / "staging"
    for d in (blobs, models, staging):
        d.mkdir(parents=True, exist_ok=True)
    for child in staging.iterdir():
        if child.name.startswith((IMPORT_PREFIX, ".gone-")):
            shutil.rmtree(child, ignore_errors=True)
    for child in blobs.iterdir():
        if not is_sha256_hex(child.name):
            child.unlink()
    index = read_index(root / INDEX_NAME)
    present: dict[str, Manifest] = {}
    for child in models.iterdir():
        manifest = read_model_manifest(child, blobs)
        if manifest is None:
            shutil.rmtree(child, ignore_errors=True)
        else:
            present[child.name] = manifest
    kept = [e for e in (index or EMPTY).models if e.sha256 in present]
    listed = {e.sha256 for e in kept}
    adopted = [
        IndexEntry(sha, sum(blob_sizes(m).values()), 0.0, ())
        for sha, m in present.items()
        if sha not in listed
    ]
    recovered = Index(INDEX_VERSION, tuple(sorted(kept + adopted, key=lambda e: e.sha256)))
    if recovered != index:
        write_index(root / INDEX_NAME, recovered)
    referenced: set[str] = set()
    for manifest in present.values():
        referenced |= blob_sizes(manifest).keys()
    loose = {p.name: p.stat().st_size for p in blobs.iterdir() if p.name not in referenced}
    return Recovered(recovered, present, loose)


def read_model_manifest(directory: Path, blobs: Path) -> Manifest | None:
    """The manifest of a model directory if it is complete (every file there, every blob in
    ``blobs``) and named by its hash."""
    if not is_sha256_hex(directory.name) or not directory.is_dir():
        return None
    try:
        body = (directory / MANIFEST_NAME).read_bytes()
        if manifest_sha256(body) != directory.name:
            return None
        manifest = decode_manifest(body)
    except (OSError, ManifestInvalid):
        return None
    for f in manifest.files:
        if not (directory / f.name).is_file() or not (blobs / f.sha256.hex()).is_file():
            return None
    return manifest
