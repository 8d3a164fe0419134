"""A runner's phase: moved only along :data:`~skulk.runner.TRANSITIONS`, each move recorded in
the flight recorder and announced to whoever follows the runner (its ``on_phase``)."""

from __future__ import annotations

from collections.abc import Callable

from skulk.runner._config import TRANSITIONS, Phase
from skulk.runner._recorder import FlightRecorder


class Lifecycle:
    """The phase of one runner incarnation and its loading progress. ``announce`` is called
    after every move and every progress report."""

    def __init__(self, recorder: FlightRecorder, announce: Callable[[], None]) -> None:
        self.phase: Phase = "spawning"
        #: Loading progress as the runner last reported it: (loaded, total).
        self.progress = (0, 0)
        self._recorder = recorder
        self._announce = announce

    def move(self, phase: Phase, detail: str = "") -> None:
        """Go to ``phase`` (nothing when already there); a move the table does not allow is a
        bug (``AssertionError``)."""
        if phase == self.phase:
            return
        if phase not in TRANSITIONS[self.phase]:
            raise AssertionError(f"runner cannot go from {self.phase} to {phase}")
        self.phase = phase
        self._recorder.record("phase", f"{phase}{': ' + detail if detail else ''}")
        self._announce()

    def loading(self, loaded: int, total: int) -> None:
        """The runner reported loading progress."""
        self.progress = (loaded, total)
        self._recorder.record("progress", f"loading {loaded}/{total}")
        self._announce()

    @property
    def serving(self) -> bool:
        """Whether the runner takes requests now."""
        return self.phase in ("ready", "busy")
