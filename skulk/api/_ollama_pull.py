"""A pull's statuses as Ollama's ``POST /api/pull`` stream, sans-IO.

Ollama's clients read ``{"status", "digest", "total", "completed"}`` lines: the ``ollama`` CLI
draws one bar per ``digest`` (its ``total`` fixed when the bar first appears) and shows a
spinner for a line without one; the Python client yields each line and raises on an
``{"error": …}`` line. :class:`OllamaPullLines` turns our statuses into that:

* ``pulling manifest`` first (the Hub check);
* while the model downloads, a bar per file the downloader fetches (``downloading <file>``,
  the file's size and bytes done), the previous file's bar finished when the next begins;
* while it spreads to the other nodes, one bar for the bytes the cluster still gains
  (``spreading to N nodes``);
* then ``verifying sha256 digest``, ``writing manifest``, ``success``, as Ollama ends.

``digest`` is a key, not the file's content hash (a status does not carry per-file hashes):
``sha256:`` and the sha256 of the repo, commit and file name, stable for a file of a commit.
Repeated identical lines are left out.
"""

from __future__ import annotations

import hashlib

from skulk.api._pull_format import PullStatusView

Line = dict[str, object]


def digest_key(*parts: str) -> str:
    """A stable ``sha256:…`` key for a bar (see the module docstring)."""
    return "sha256:" + hashlib.sha256("\0".join(parts).encode()).hexdigest()


class OllamaPullLines:
    """Feed statuses in order (:meth:`feed`), then :meth:`finish` once the pull is done;
    each returns the Ollama lines to send."""

    def __init__(self) -> None:
        self._started = False
        self._file: tuple[str, int] | None = None  # the file whose bar is open: digest, total
        self._last: Line | None = None

    def feed(self, status: PullStatusView) -> list[Line]:
        lines: list[Line] = []
        if not self._started:
            self._started = True
            lines.append({"status": "pulling manifest"})
        if status.phase == "downloading":
            lines += self._downloading(status)
        elif status.phase == "spreading":
            lines += self._close_file()
            lines += self._spreading(status)
        return self._new(lines)

    def finish(self) -> list[Line]:
        lines: list[Line] = [] if self._started else [{"status": "pulling manifest"}]
        self._started = True
        lines += self._close_file()
        lines += [
            {"status": "verifying sha256 digest"},
            {"status": "writing manifest"},
            {"status": "success"},
        ]
        return self._new(lines)

    def _downloading(self, status: PullStatusView) -> list[Line]:
        transfer = next(
            (t for node, t in status.transfers if node == status.downloader and t.file), None
        )
        if transfer is None:
            return [{"status": f"downloading {status.repo}"}]
        digest = digest_key(status.repo, status.commit, transfer.file)
        lines: list[Line] = []
        if self._file is not None and self._file[0] != digest:
            lines += self._close_file()
        self._file = (digest, transfer.file_total)
        lines.append(
            {
                "status": f"downloading {transfer.file}",
                "digest": digest,
                "total": transfer.file_total,
                "completed": min(transfer.file_done, transfer.file_total),
            }
        )
        return lines

    def _spreading(self, status: PullStatusView) -> list[Line]:
        others = len(set(status.nodes) - set(status.holders))
        if others == 0 or status.target_bytes <= 0:
            return []
        key = digest_key(status.repo, status.commit, f"spread:{status.target_bytes}")
        return [
            {
                "status": f"spreading to {others} node{'' if others == 1 else 's'}",
                "digest": key,
                "total": status.target_bytes,
                "completed": min(status.done_bytes, status.target_bytes),
            }
        ]

    def _close_file(self) -> list[Line]:
        if self._file is None:
            return []
        digest, total = self._file
        self._file = None
        return [{"status": "downloaded", "digest": digest, "total": total, "completed": total}]

    def _new(self, lines: list[Line]) -> list[Line]:
        fresh = []
        for line in lines:
            if line != self._last:
                fresh.append(line)
                self._last = line
        return fresh
