"""A node killed mid-file (SIGKILL, a real process) resumes its Hub download from the bytes
its part file holds: nothing written is lost or fetched again from the disk's side.

The endpoint's counters also show what TCP loses at a kill: bytes the server had sent into
the socket buffers that the killed process never read (a few MiB on loopback). That is
printed, not asserted (it depends on the kernel's buffer sizes, not on us); a connection cut
(tests/unit/test_hub_download.py) re-sends at most one read buffer.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from skulk.hub import check, download
from skulk.hub._download import part_path
from tests.hubserver import HubServer, hub

__all__ = ["hub"]  # fixture

SIZE = 48 * 1024 * 1024 + 12345
NAME = "model.safetensors"

CHILD = """
import os, signal, sys
from pathlib import Path
from skulk.hub import check, download
from skulk.hub._download import part_path
staging, half = Path(sys.argv[1]), int(sys.argv[2])
plan = check("org/big")
part = part_path(staging, plan.files[1])
def kill_at_half():
    if part.exists() and part.stat().st_size >= half:
        os.kill(os.getpid(), signal.SIGKILL)
    return False
download(plan, staging, cancel_check=kill_at_half)
"""


def test_a_killed_download_resumes_from_its_part_file(hub: HubServer, tmp_path: Path) -> None:
    body = random.Random(7).randbytes(SIZE)
    hub.add_repo(
        "org/big", {"config.json": json.dumps({"model_type": "llama"}).encode(), NAME: body}
    )
    staging = tmp_path / "staging"
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(staging), str(SIZE // 2)], env=env, timeout=120
    )
    assert child.returncode == -signal.SIGKILL

    plan = check("org/big")
    part = part_path(staging, plan.files[1])
    kept = part.stat().st_size
    assert SIZE // 2 <= kept < SIZE
    sent_before = hub.served_bytes("org/big", NAME)

    got = download(plan, staging)
    assert (staging / NAME).read_bytes() == body and got[NAME] == plan.files[1].sha256
    gets = [r for m, p, r in hub.requests if m == "GET" and p.endswith(NAME)]
    assert gets == [None, f"bytes={kept}-"]  # resumed exactly where the disk stopped
    assert hub.served_bytes("org/big", NAME) - sent_before == SIZE - kept
    in_flight = sent_before - kept
    print(f"killed at {kept} bytes: {in_flight} sent but unread ({in_flight / SIZE:.2%})")
