"""Checking a Hub model before any weight byte moves: :func:`check` returns a
:class:`HubPlan` (the commit, the files a runner needs with their sizes and the Hub's
hashes, config.json's ``model_type``, the total) or raises a typed :class:`HubError`.

Which files: the same rule as a model directory's manifest (``skulk.models.is_weight_file``:
top-level ``*.safetensors``, ``*.json`` and the tokenizer files), so a downloaded directory's
manifest lists exactly the plan's files. Which architectures: what mlx-lm 0.32 loads, decided
as ``mlx_lm.utils._get_classes`` decides (``MODEL_ARCHITECTURE_REMAPPING`` for the
``(model_type, architecture)`` pairs, else ``MODEL_REMAPPING``, then a module
``mlx_lm.models.<type>`` must exist).

Blocking (network and file I/O): call from a worker thread.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import attrs
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # lazy export

from skulk.hub._calls import DEFAULT_POLICY, HubPolicy, call_hub, default_endpoint
from skulk.hub._errors import HubError, NoWeights, OfflineMissing, UnsupportedArchitecture
from skulk.hub._ref import COMMIT_SHA, HubRef, parse_hub_ref
from skulk.hub._tqdm import SilentTqdm
from skulk.models import is_weight_file

_MODEL_TYPE = re.compile(r"^[a-z0-9_]{1,64}$")
_MAX_CONFIG_BYTES = 16 * 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


@attrs.frozen
class HubFile:
    """One file of the plan: ``size`` bytes, hashed by the Hub as ``sha256`` (an LFS file)
    or only by its git blob id ``git_sha1`` (a small file kept in git)."""

    name: str
    size: int
    sha256: str | None
    git_sha1: str | None

    @property
    def etag(self) -> str:
        """What the Hub's ``ETag`` / ``X-Linked-Etag`` carries for this file."""
        return self.sha256 or self.git_sha1 or ""


@attrs.frozen
class HubPlan:
    """A checked Hub model. ``ref`` is pinned at ``commit``; ``files`` are sorted by name;
    ``total_bytes`` is their sum (what the caller checks against its disk and budget);
    ``cached_snapshot`` is the local Hub cache's snapshot directory when it already holds
    every file (import it instead of downloading)."""

    ref: HubRef
    commit: str
    files: tuple[HubFile, ...]
    model_type: str
    endpoint: str
    cached_snapshot: Path | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def name(self) -> str:
        """The pinned name, ``org/repo@<commit>``."""
        return f"{self.ref.repo}@{self.commit}"


def check(
    ref: HubRef | str,
    token: str | None = None,
    *,
    endpoint: str | None = None,
    offline: bool | None = None,
    cache_dir: Path | None = None,
    policy: HubPolicy = DEFAULT_POLICY,
) -> HubPlan:
    """Check ``ref`` on the Hub (``endpoint``: default ``HF_ENDPOINT``, read now) and plan
    its download. ``token``: ``None`` lets huggingface_hub find one (``HF_TOKEN``, a saved
    login). ``offline`` (default: ``HF_HUB_OFFLINE``, read now) plans from the local Hub
    cache only (``cache_dir``, default ``HF_HUB_CACHE`` / ``HF_HOME/hub`` /
    ``~/.cache/huggingface/hub``). Raises :class:`HubError` subclasses (see the module)."""
    if isinstance(ref, str):
        ref = parse_hub_ref(ref)
    endpoint = (endpoint or default_endpoint()).rstrip("/")
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    if offline:
        return plan_from_cache(ref, cache, endpoint)
    api = HfApi(endpoint=endpoint, token=token, library_name="skulk")
    info = call_hub(
        ref,
        endpoint,
        token,
        policy,
        lambda: api.model_info(
            ref.repo,
            revision=ref.revision_or_default,
            files_metadata=True,
            timeout=policy.call_timeout_s,
        ),
    )
    commit = info.sha or ""
    if not COMMIT_SHA.match(commit):
        raise HubError(str(ref), f"Hub repo {ref}: the revision info has no commit sha")
    files: list[HubFile] = []
    for sibling in info.siblings or ():
        if not is_weight_file(sibling.rfilename):
            continue
        files.append(
            _listed_file(ref, sibling.rfilename, sibling.size, sibling.lfs, sibling.blob_id)
        )
    files.sort(key=lambda f: f.name)
    config_file = _require_config_and_weights(ref, files)
    pinned = ref.at(commit)
    body = call_hub(
        ref, endpoint, token, policy, lambda: _fetch_small(pinned, config_file, endpoint, token)
    )
    model_type = _check_config(str(ref), body)
    snapshot = _cached_snapshot(cache, ref.repo, commit, files)
    return HubPlan(ref, commit, tuple(files), model_type, endpoint, snapshot)


def plan_from_cache(ref: HubRef, cache: Path, endpoint: str) -> HubPlan:
    """The plan of ``ref`` as the local Hub cache holds it (raises :class:`OfflineMissing`
    unless its revision and every file a runner needs are there)."""
    root = cache / ("models--" + ref.repo.replace("/", "--"))
    revision = ref.revision_or_default
    commit = revision
    if not ref.is_pinned:
        try:
            commit = (root / "refs" / revision).read_text().strip()
        except OSError:
            raise OfflineMissing(str(ref), f"no cached revision {revision!r}") from None
    snapshot = root / "snapshots" / commit
    if not COMMIT_SHA.match(commit) or not snapshot.is_dir():
        raise OfflineMissing(str(ref), f"no cached snapshot for {revision!r}")
    files = []
    for path in sorted(snapshot.iterdir()):
        if not is_weight_file(path.name) or not path.is_file():
            continue
        blob = Path(os.readlink(path)).name if path.is_symlink() else ""
        sha256 = blob if _SHA256.match(blob) else None
        sha1 = blob if _SHA1.match(blob) else None
        files.append(HubFile(path.name, path.stat().st_size, sha256, sha1))
    config_file = _require_config_and_weights(ref, files)
    model_type = _check_config(str(ref), (snapshot / config_file.name).read_bytes())
    _check_index_complete(ref, snapshot, {f.name for f in files})
    return HubPlan(ref, commit, tuple(files), model_type, endpoint, snapshot)


def default_cache_dir() -> Path:
    """The local Hub cache, from the environment read now."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def mlx_lm_module(config: Mapping[str, object]) -> str | None:
    """The ``mlx_lm.models`` module that would load a model with this config.json, or
    ``None`` when mlx-lm has none (the decision ``mlx_lm.utils._get_classes`` makes)."""
    from mlx_lm import utils as mlx_utils  # heavy; only when a config is checked

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return None
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    arch_map = getattr(mlx_utils, "MODEL_ARCHITECTURE_REMAPPING", {})
    remapped = None
    if isinstance(architectures, (list, tuple)):
        remapped = next(
            (arch_map[(model_type, a)] for a in architectures if (model_type, a) in arch_map),
            None,
        )
    if remapped is None:
        remapped = getattr(mlx_utils, "MODEL_REMAPPING", {}).get(model_type, model_type)
    if not isinstance(remapped, str) or not _MODEL_TYPE.match(remapped):
        return None
    found = importlib.util.find_spec(f"mlx_lm.models.{remapped}") is not None
    return remapped if found else None


def _listed_file(ref: HubRef, name: str, size: object, lfs: object, blob_id: object) -> HubFile:
    """A file as the revision info lists it, checked: a size, and a hash to verify by."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise HubError(str(ref), f"Hub repo {ref}: bad size {size!r} listed for {name}")
    sha256 = lfs.get("sha256") if isinstance(lfs, dict) else None
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.match(sha256)):
        raise HubError(str(ref), f"Hub repo {ref}: bad LFS sha256 listed for {name}")
    if not (isinstance(blob_id, str) and _SHA1.match(blob_id)):
        if sha256 is None:
            raise HubError(str(ref), f"Hub repo {ref}: no hash listed for {name}")
        blob_id = None
    return HubFile(name, size, sha256, blob_id)


def _require_config_and_weights(ref: HubRef, files: list[HubFile]) -> HubFile:
    config = next((f for f in files if f.name == "config.json"), None)
    if config is None:
        raise UnsupportedArchitecture(str(ref), None, "no config.json")
    if not any(f.name.endswith(".safetensors") for f in files):
        raise NoWeights(str(ref))
    return config


def _check_config(repo: str, body: bytes) -> str:
    try:
        config = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise UnsupportedArchitecture(repo, None, "config.json is not JSON") from None
    if not isinstance(config, dict):
        raise UnsupportedArchitecture(repo, None, "config.json is not an object")
    model_type = config.get("model_type")
    if mlx_lm_module(config) is None:
        raise UnsupportedArchitecture(repo, model_type if isinstance(model_type, str) else None)
    assert isinstance(model_type, str)
    return model_type


def _fetch_small(ref: HubRef, file: HubFile, endpoint: str, token: str | None) -> bytes:
    """A small file's bytes, through huggingface_hub's ``http_get`` (its headers, retries
    and error translation)."""
    if file.size > _MAX_CONFIG_BYTES:
        raise UnsupportedArchitecture(str(ref), None, f"{file.name} is {file.size} bytes")
    url = hf_hub_url(ref.repo, file.name, revision=ref.revision, endpoint=endpoint)
    out = io.BytesIO()
    headers = build_hf_headers(token=token, library_name="skulk")
    http_get(url, out, headers=headers, expected_size=file.size, tqdm_class=SilentTqdm)
    return out.getvalue()


def _cached_snapshot(cache: Path, repo: str, commit: str, files: list[HubFile]) -> Path | None:
    snapshot = cache / ("models--" + repo.replace("/", "--")) / "snapshots" / commit
    try:
        if all((snapshot / f.name).stat().st_size == f.size for f in files):
            return snapshot
    except OSError:
        pass
    return None


def _check_index_complete(ref: HubRef, snapshot: Path, names: set[str]) -> None:
    index = snapshot / "model.safetensors.index.json"
    if not index.is_file():
        return
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map", {})
        needed = set(weight_map.values()) if isinstance(weight_map, dict) else set()
    except (ValueError, AttributeError):
        raise OfflineMissing(str(ref), "model.safetensors.index.json is damaged") from None
    missing = sorted(str(n) for n in needed - names)
    if missing:
        raise OfflineMissing(str(ref), f"missing {', '.join(missing)}")
