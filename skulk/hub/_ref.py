"""Hub references: ``ORG/REPO[@REVISION]``, parsed and validated without any network."""

from __future__ import annotations

import re

import attrs

#: One side of ``ORG/REPO``: what the Hub accepts (ASCII letters, digits, ``_ - .``, at most
#: 96 characters, not starting or ending with ``-`` or ``.``; no ``--`` or ``..``).
_PART = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?$")
#: A branch, tag or commit: git ref characters, no ``..``, no leading ``/`` or ``-``.
_REVISION = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./+-]{0,199}$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_REVISION = "main"


@attrs.frozen
class HubRef:
    """A model on the Hub: ``repo`` (``org/name``) at ``revision`` (a branch, a tag or a
    commit sha; ``None`` means the default branch, ``main``)."""

    repo: str
    revision: str | None = None

    @property
    def revision_or_default(self) -> str:
        return self.revision if self.revision is not None else DEFAULT_REVISION

    @property
    def is_pinned(self) -> bool:
        """Whether the revision is a full commit sha (the files can never change)."""
        return self.revision is not None and COMMIT_SHA.match(self.revision) is not None

    def at(self, commit: str) -> HubRef:
        """The same repo pinned at ``commit``."""
        return HubRef(self.repo, commit)

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def parse_hub_ref(text: str) -> HubRef:
    """Parse ``ORG/REPO`` or ``ORG/REPO@REVISION``. Raises ``ValueError`` naming what is
    wrong (the organisation, the repo name or the revision) and the text given."""
    if not isinstance(text, str):
        raise ValueError(f"a Hub model id must be a string, not {type(text).__name__}")
    repo, at, revision = text.strip().partition("@")
    if at and not revision:
        raise ValueError(f"Hub model id {text!r}: empty revision after '@'")
    if repo.count("/") != 1:
        raise ValueError(f"Hub model id {text!r}: expected ORG/REPO[@REVISION] (one '/')")
    org, name = repo.split("/")
    for what, part in (("organisation", org), ("repo name", name)):
        if not _PART.match(part) or "--" in part or ".." in part:
            raise ValueError(
                f"Hub model id {text!r}: bad {what} {part!r} (1-96 of A-Z a-z 0-9 _ - ., "
                "not starting or ending with - or ., no -- or ..)"
            )
    if at and (not _REVISION.match(revision) or ".." in revision or revision.endswith("/")):
        raise ValueError(f"Hub model id {text!r}: bad revision {revision!r}")
    return HubRef(repo, revision if at else None)


def looks_like_hub_ref(text: str) -> bool:
    """Whether ``text`` has the shape of a Hub id (``ORG/REPO[@REVISION]``). A relative path
    of two parts (``models/foo``) has that shape too: callers try an existing directory
    first, then a Hub id."""
    if text.startswith(("/", ".", "~")) or "\\" in text:
        return False
    try:
        parse_hub_ref(text)
    except ValueError:
        return False
    return True
