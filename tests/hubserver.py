"""A local Hugging Face Hub endpoint for tests: the real ``huggingface_hub`` client (2.4)
talks to it through ``HF_ENDPOINT=http://127.0.0.1:PORT``; nothing reaches the internet.

It serves repos given as ``{file name: bytes}`` (e.g. a directory written by
``skulk.models.write_generated_model``), each at one commit, with the HTTP contract the
client uses:

* ``GET /api/models/{org}/{name}/revision/{rev}`` (``HfApi.model_info``; ``?blobs=true``
  adds each sibling's ``size``, ``blobId`` and ``lfs: {sha256, size, pointerSize}``);
* ``GET /api/models/{org}/{name}/tree/{rev}`` (``list_repo_tree``, what ``snapshot_download``
  and ``hf download`` list with): ``{type, path, size, oid, lfs: {oid, size, pointerSize}}``;
* ``HEAD`` / ``GET /{org}/{name}/resolve/{rev}/{file}``: ``X-Repo-Commit``, ``ETag`` (the
  sha256 of an LFS file, the git blob sha1 of a small one, quoted), ``X-Linked-Etag`` and
  ``X-Linked-Size`` for LFS files, ``Content-Length``, ``Accept-Ranges``; ``Range:
  bytes=a-[b]`` answers 206 with ``Content-Range`` (416 past the end);
* errors as the Hub signals them: 404 with ``X-Error-Code`` ``RepoNotFound`` /
  ``RevisionNotFound`` / ``EntryNotFound``; a gated repo's info is public but its files
  answer 401 (no token) or 403 (a token without access) with ``X-Error-Code: GatedRepo``.

``*.safetensors`` files and files over 10 MiB are "LFS" files; ``main`` and the commit sha
name the one revision.

Not reproduced: the Hub's redirect of LFS files to a CDN on another host (the client reads
the same headers from the redirect and follows it with ``Range`` as here); Xet (no
``X-Xet-Hash`` header is ever sent, so the client never tries Xet); several commits or
branches per repo; subfolders; tree pagination; rate-limit headers.

Faults, switchable per test: :meth:`HubServer.cut_once` (the next GET of a file stops at a
byte offset and the connection is dropped), :meth:`HubServer.corrupt` (the next GETs serve
a byte flipped), :meth:`HubServer.go_away` (connections refused from now on; also after a
cut, with ``then_gone=True``), :meth:`HubServer.ignore_range_once`,
:meth:`HubServer.fail_next` (503s),
:meth:`HubServer.patch_info` (a malformed revision info). :attr:`HubServer.served` counts
body bytes sent per file; :attr:`HubServer.requests` records ``(method, path, Range)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import attrs
import pytest

LFS_THRESHOLD = 10 * 1024 * 1024
_WRITE_BLOCK = 64 * 1024
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@attrs.frozen
class HubFileData:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_sha1(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1

    @property
    def pointer_size(self) -> int:
        pointer = (
            "version https://git-lfs.github.com/spec/v1\n"
            f"oid sha256:{self.sha256}\nsize {len(self.data)}\n"
        )
        return len(pointer.encode())


@attrs.define
class HubRepo:
    repo_id: str
    files: dict[str, HubFileData]
    gated_token: str | None = None
    commit: str = ""

    def __attrs_post_init__(self) -> None:
        listing = "".join(f"{n} {f.etag}\n" for n, f in sorted(self.files.items()))
        self.commit = hashlib.sha1(f"{self.repo_id}\n{listing}".encode()).hexdigest()


def repo_files(directory: Path) -> dict[str, bytes]:
    """The files of a model directory (top level), as a repo's content."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


class HubServer:
    """The endpoint; start it with :func:`running_hub`. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.repos: dict[str, HubRepo] = {}
        self.served: Counter[tuple[str, str]] = Counter()
        self.requests: list[tuple[str, str, str | None]] = []
        self._cuts: dict[tuple[str, str], tuple[int, bool]] = {}
        self._corrupt: Counter[tuple[str, str]] = Counter()
        self._ignore_range: set[tuple[str, str]] = set()
        self._gone = False
        self._failures = 0
        self._httpd: ThreadingHTTPServer | None = None
        self.info_patches: dict[str, dict[str, object]] = {}

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def add_repo(
        self, repo_id: str, files: Mapping[str, bytes], *, gated_token: str | None = None
    ) -> HubRepo:
        """Serve ``files`` as ``repo_id`` (``gated_token``: the one token that may read its
        files). Returns the repo (its ``commit``, each file's ``etag``)."""
        data = {
            name: HubFileData(body, name.endswith(".safetensors") or len(body) > LFS_THRESHOLD)
            for name, body in files.items()
        }
        repo = HubRepo(repo_id, data, gated_token)
        with self._lock:
            self.repos[repo_id] = repo
        return repo

    def cut_once(self, repo_id: str, file: str, at: int, *, then_gone: bool = False) -> None:
        """The next GET of ``file`` sends its bytes up to offset ``at`` only, then drops the
        connection (and with ``then_gone``, refuses connections from then on)."""
        with self._lock:
            self._cuts[(repo_id, file)] = (at, then_gone)

    def corrupt(self, repo_id: str, file: str, times: int = 1) -> None:
        """The next ``times`` GETs of ``file`` serve it with one byte flipped."""
        with self._lock:
            self._corrupt[(repo_id, file)] = times

    def ignore_range_once(self, repo_id: str, file: str) -> None:
        """The next GET of ``file`` ignores its ``Range`` and answers 200 with every byte (as
        a CDN that compresses can)."""
        with self._lock:
            self._ignore_range.add((repo_id, file))

    def fail_next(self, n: int) -> None:
        """The next ``n`` requests (any route) answer 503, as an overloaded Hub does."""
        with self._lock:
            self._failures = n

    def patch_info(self, repo_id: str, fields: dict[str, object]) -> None:
        """Replace fields of ``repo_id``'s revision info (malformed answers)."""
        with self._lock:
            self.info_patches[repo_id] = fields

    def go_away(self) -> None:
        """Refuse connections from now on (the listening socket is closed)."""
        with self._lock:
            if self._gone:
                return
            self._gone = True
            httpd = self._httpd
        if httpd is not None:
            httpd.shutdown()  # waits for the accept loop (another thread) to stop
            httpd.server_close()

    @property
    def gone(self) -> bool:
        return self._gone

    def served_bytes(self, repo_id: str, file: str) -> int:
        with self._lock:
            return self.served[(repo_id, file)]

    # -- used by the handler -------------------------------------------------------------

    def _take_ignore_range(self, key: tuple[str, str]) -> bool:
        with self._lock:
            if key in self._ignore_range:
                self._ignore_range.discard(key)
                return True
            return False

    def _take_failure(self) -> bool:
        with self._lock:
            if self._failures > 0:
                self._failures -= 1
                return True
            return False

    def _take_cut(self, key: tuple[str, str]) -> tuple[int, bool] | None:
        with self._lock:
            return self._cuts.pop(key, None)

    def _take_corrupt(self, key: tuple[str, str]) -> bool:
        with self._lock:
            if self._corrupt[key] > 0:
                self._corrupt[key] -= 1
                return True
            return False

    def _count(self, key: tuple[str, str], n: int) -> None:
        with self._lock:
            self.served[key] += n


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        hub = self.server.hub
        if hub.gone:
            self.close_connection = True
            return
        with hub._lock:
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
        if hub._take_failure():
            self._error(503, "", "Service Unavailable")
            return
        path = urlsplit(self.path).path
        parts = [unquote(p) for p in path.split("/")[1:]]
        query = urlsplit(self.path).query
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] in ("revision", "tree"):
            repo = self._repo(f"{parts[2]}/{parts[3]}")
            if repo is None or not self._revision_ok(repo, "/".join(parts[5:])):
                return
            if parts[4] == "revision":
                info = self._info(repo, blobs="blobs=true" in query.lower())
                info.update(hub.info_patches.get(repo.repo_id, {}))
                self._json(info, head)
            else:
                self._json(self._tree(repo), head)
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo(f"{parts[0]}/{parts[1]}")
            if repo is None or not self._revision_ok(repo, parts[3]):
                return
            self._resolve(repo, "/".join(parts[4:]), head)
            return
        self._error(404, "", "not a Hub route")

    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return repo

    def _revision_ok(self, repo: HubRepo, revision: str) -> bool:
        if revision in ("main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
        return False

    def _info(self, repo: HubRepo, blobs: bool) -> dict[str, object]:
        siblings: list[dict[str, object]] = []
        for name, f in sorted(repo.files.items()):
            entry: dict[str, object] = {"rfilename": name}
            if blobs:
                entry.update(size=len(f.data), blobId=f.git_sha1 if not f.lfs else _oid(f))
                if f.lfs:
                    entry["lfs"] = {
                        "sha256": f.sha256,
                        "size": len(f.data),
                        "pointerSize": f.pointer_size,
                    }
            siblings.append(entry)
        return {
            "_id": repo.commit[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": repo.commit,
            "private": False,
            "gated": "manual" if repo.gated_token else False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
        }

    def _tree(self, repo: HubRepo) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for name, f in sorted(repo.files.items()):
            entry: dict[str, object] = {
                "type": "file",
                "path": name,
                "size": len(f.data),
                "oid": f.git_sha1 if not f.lfs else _oid(f),
            }
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": f.pointer_size}
            out.append(entry)
        return out

    def _resolve(self, repo: HubRepo, name: str, head: bool) -> None:
        hub = self.server.hub
        f = repo.files.get(name)
        if f is None:
            self._error(404, "EntryNotFound", f"{name} does not exist", commit=repo.commit)
            return
        if repo.gated_token is not None:
            auth = self.headers.get("Authorization", "")
            if not auth:
                self._error(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted.")
                return
            if auth != f"Bearer {repo.gated_token}":
                self._error(403, "GatedRepo", f"Access to model {repo.repo_id} is restricted.")
                return
        size = len(f.data)
        start, end = 0, size
        status = 200
        wanted = self.headers.get("Range")
        if wanted and not head and hub._take_ignore_range((repo.repo_id, name)):
            wanted = None
        if wanted:
            m = _RANGE.match(wanted.strip())
            if m is None or int(m.group(1)) >= max(size, 1):
                self._error(416, "", "Requested range not satisfiable", size=size)
                return
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            status = 206
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{f.etag}"')
        if f.lfs:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if head:
            return
        key = (repo.repo_id, name)
        body = f.data
        if hub._take_corrupt(key) and size:
            flip = size // 2
            body = body[:flip] + bytes([body[flip] ^ 0xFF]) + body[flip + 1 :]
        cut = hub._take_cut(key)
        stop = min(end, cut[0]) if cut is not None else end
        at = start
        try:
            while at < stop:
                n = min(_WRITE_BLOCK, stop - at)
                self.wfile.write(body[at : at + n])
                hub._count(key, n)
                at += n
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return
        if cut is not None and stop < end:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            if cut[1]:
                hub.go_away()

    def _json(self, payload: object, head: bool) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(
        self, status: int, code: str, message: str, *, commit: str = "", size: int = -1
    ) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        if size >= 0:
            self.send_header("Content-Range", f"bytes */{size}")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _oid(f: HubFileData) -> str:
    """An LFS file's git blob id: the sha1 of its pointer file."""
    pointer = (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{f.sha256}\nsize {len(f.data)}\n"
    )
    return hashlib.sha1(b"blob %d\0" % len(pointer) + pointer.encode()).hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: HubServer


@contextlib.contextmanager
def running_hub() -> Iterator[HubServer]:
    """A :class:`HubServer` listening on 127.0.0.1 (a free port) until the block ends."""
    hub = HubServer()
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.hub = hub
    hub._httpd = httpd
    thread = threading.Thread(target=httpd.serve_forever, daemon=True, name="hubserver")
    thread.start()
    try:
        yield hub
    finally:
        hub.go_away()
        thread.join(timeout=10)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    """A running endpoint, with this process pointed at it: ``HF_ENDPOINT``, no telemetry,
    no token, an empty Hub cache under ``tmp_path``, not offline."""
    with running_hub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated llama (two safetensors shards and an index), for repos to serve."""
    from skulk.models import ModelShape, ensure_demo_model, write_generated_model

    root = tmp_path_factory.mktemp("hub-model")
    demo = ensure_demo_model(root / "demo-home")
    return write_generated_model(root / "gen", ModelShape(layers=2), demo, files=2, seed=3)
