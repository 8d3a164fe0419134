from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from skulk.runner._stops import StopMatcher


def run(stops: tuple[str, ...], deltas: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = []
    for d in deltas:
        text, stopped = m.feed(d)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def test_stop_split_across_deltas_is_not_emitted() -> None:
    assert run(("END",), ["hello E", "N", "D and more"]) == ("hello ", True)


def test_partial_match_is_released_when_it_fails() -> None:
    m = StopMatcher(("END",))
    assert m.feed("abc EN") == ("abc ", False)
    assert m.feed("x") == ("ENx", False)


def test_earliest_stop_wins() -> None:
    assert run(("b", "abc"), ["xxabc"]) == ("xx", True)  # "abc" starts before "b"


def test_no_stops_passes_through() -> None:
    assert run((), ["a", "b"]) == ("ab", False)


def test_held_text_flushed_at_end() -> None:
    assert run(("END",), ["abc", "EN"]) == ("abcEN", False)


@given(
    text=st.text(alphabet="abcE ND", max_size=40),
    stops=st.lists(st.text(alphabet="abcEND", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_any_chunking_emits_text_before_first_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    points = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in itertools.pairwise(points)]
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    expected = (text[: min(hits)], True) if hits else (text, False)
    assert run(tuple(stops), deltas) == expected
