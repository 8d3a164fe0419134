from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from skulk.harness import NodeProcess
from skulk.models import ensure_demo_model


@pytest.fixture(scope="session")
def skulk_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir with the demo model already generated (so each server starts quickly)."""
    home = tmp_path_factory.mktemp("skulk-home")
    ensure_demo_model(home)
    return home


@pytest.fixture(scope="module")
def server(skulk_home: Path) -> Iterator[NodeProcess]:
    with NodeProcess(skulk_home) as srv:
        yield srv
