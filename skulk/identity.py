"""This node's stable identity: a node id generated once and kept in the data dir."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

NODE_ID_FILE = "node-id"


class IdentityError(Exception):
    """The stored node id is unusable; the message names the file."""


def load_or_create_node_id(home: Path) -> str:
    """The node id stored in ``home/node-id``, generated (``node-`` + 16 hex digits) and written
    atomically on first use; two processes racing on a fresh data dir end with one id."""
    path = home / NODE_ID_FILE
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        tmp = home / f".{NODE_ID_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        tmp.write_text(f"node-{secrets.token_hex(8)}\n")
        try:
            os.link(tmp, path)  # fails if another process got there first: keep theirs
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    node_id = path.read_text().strip()
    if not node_id or len(node_id) > 128 or not node_id.isprintable():
        raise IdentityError(f"{path}: not a node id (1-128 printable characters); delete it")
    return node_id
