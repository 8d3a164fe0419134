from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from skulk.engine._stops import StopMatcher


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


def test_first_stop_to_complete_wins() -> None:
    # "abc" starts before "b", but "b" completes first: a reader going character by character
    # stops there.
    assert run(("b", "abc"), ["xxabc"]) == ("xxa", True)
    assert run(("c", "DcD"), ["DDcD"]) == ("DD", True)
    assert run(("c", "DcD"), ["DDc", "D"]) == ("DD", True)


def test_stops_completing_together_cut_at_the_longest() -> None:
    assert run(("bc", "abc"), ["xabcx"]) == ("x", True)


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
    assert run(tuple(stops), deltas) == one_character_at_a_time(text, stops)


@given(
    text=st.text(alphabet="abcE ND", max_size=40),
    stops=st.lists(st.text(alphabet="abcEND", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_nothing_emitted_is_ever_taken_back(text: str, stops: list[str], cuts: list[int]) -> None:
    """Every emitted piece is a prefix of the final output, at every chunking."""
    points = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    m = StopMatcher(tuple(stops))
    final, _ = one_character_at_a_time(text, stops)
    emitted = ""
    for a, b in itertools.pairwise(points):
        piece, stopped = m.feed(text[a:b])
        emitted += piece
        assert final.startswith(emitted)
        if stopped:
            break


def one_character_at_a_time(text: str, stops: list[str]) -> tuple[str, bool]:
    """The oracle: read ``text`` character by character; stop as soon as a stop string has
    completed, cutting at the start of the longest one that completed on that character."""
    for end in range(1, len(text) + 1):
        done = [end - len(s) for s in stops if s and text[:end].endswith(s)]
        if done:
            return text[: min(done)], True
    return text, False
