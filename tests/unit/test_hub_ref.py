"""Hub references: what parses, what is refused (with the part named), and the shape test
callers use to tell a Hub id from a path or a name."""

from __future__ import annotations

import pytest

from skulk.hub import HubRef, looks_like_hub_ref, parse_hub_ref


@pytest.mark.parametrize(
    ("text", "repo", "revision"),
    [
        (
            "mlx-community/Llama-3.2-1B-Instruct-4bit",
            "mlx-community/Llama-3.2-1B-Instruct-4bit",
            None,
        ),
        ("org/repo@main", "org/repo", "main"),
        ("Org_1/re.po@v1.0", "Org_1/re.po", "v1.0"),
        ("org/repo@refs/pr/3", "org/repo", "refs/pr/3"),
        ("org/repo@" + "a" * 40, "org/repo", "a" * 40),
        ("  org/repo  ", "org/repo", None),
    ],
)
def test_parses(text: str, repo: str, revision: str | None) -> None:
    ref = parse_hub_ref(text)
    assert ref == HubRef(repo, revision)
    assert str(ref) == text.strip()
    assert looks_like_hub_ref(text.strip())


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("repo", "one '/'"),
        ("a/b/c", "one '/'"),
        ("/org/repo", "one '/'"),
        ("/repo", "organisation ''"),
        ("org/", "repo name ''"),
        ("-org/repo", "organisation '-org'"),
        ("org/repo.", "repo name 'repo.'"),
        ("org/re--po", "repo name 're--po'"),
        ("org/re..po", "repo name 're..po'"),
        ("org/" + "r" * 97, "repo name"),
        ("org/rep o", "repo name 'rep o'"),
        ("org/repo@", "empty revision"),
        ("org/repo@../x", "revision '../x'"),
        ("org/repo@-x", "revision '-x'"),
        ("org/repo@a b", "revision 'a b'"),
        ("org/repo@x/", "revision 'x/'"),
    ],
)
def test_refuses_naming_the_part(text: str, names: str) -> None:
    with pytest.raises(ValueError, match="Hub model id") as info:
        parse_hub_ref(text)
    assert names in str(info.value)
    assert not looks_like_hub_ref(text)


def test_not_a_string() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        parse_hub_ref(7)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["./org/repo", "~/models", "skulk-demo", "C:\\m\\x", "/abs/dir"])
def test_paths_and_names_do_not_look_like_refs(text: str) -> None:
    assert not looks_like_hub_ref(text)


def test_pinning() -> None:
    ref = parse_hub_ref("org/repo")
    assert ref.revision_or_default == "main" and not ref.is_pinned
    pinned = ref.at("0123456789abcdef0123456789abcdef01234567")
    assert pinned.is_pinned and pinned.repo == "org/repo"
    assert not parse_hub_ref("org/repo@main").is_pinned
