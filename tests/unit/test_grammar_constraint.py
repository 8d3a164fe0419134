"""The runner's grammar constraint (skulk.engine._grammar) on the demo model's tokenizer: masks,
acceptance, the end of a document, padded vocabularies, rollback and batches."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import numpy as np
import pytest

from skulk.engine._engine import Engine, TokenOutput
from skulk.engine._grammar import (
    Constraint,
    ConstraintViolated,
    GrammarTokenizer,
    GrammarUnavailable,
    grammar_tokenizer,
    mask_rows,
)
from skulk.grammar import JSON_OBJECT_SCHEMA, SchemaRefused, schema_text, tool_call_schema
from skulk.models import ensure_demo_model
from skulk.models._generated import ModelShape, write_generated_model
from skulk.wire.runner import SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
        "home": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "tags", "home"],
    "additionalProperties": False,
}
PERSON_TEXT = '{"name": "Tom", "kind": "cat", "tags": [1, 22], "home": {"city": "Oslo"}}'


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine.load(model_dir, lambda n, total: None)


@pytest.fixture(scope="module")
def gtok(engine: Engine) -> GrammarTokenizer:
    return grammar_tokenizer(engine.tokenizer)


def encode(engine: Engine, text: str) -> list[int]:
    tok: Any = engine.tokenizer
    return [int(i) for i in tok.encode(text, add_special_tokens=False)]


def allowed_ids(constraint: Constraint, width: int = 1024) -> set[int]:
    return {int(i) for i in np.flatnonzero(constraint.allowed_row(width))}


def feed(constraint: Constraint, ids: list[int]) -> None:
    for token in ids:
        constraint.accept(token)


def test_the_tokenizer_is_built_once_per_engine(engine: Engine, gtok: GrammarTokenizer) -> None:
    assert grammar_tokenizer(engine.tokenizer) is gtok
    assert gtok.vocab_size == 1024
    assert gtok.eos_token_ids == tuple(sorted(engine.tokenizer.eos_token_ids)) == (0,)


def test_json_object_starts_with_a_brace_and_never_with_eos(
    engine: Engine, gtok: GrammarTokenizer
) -> None:
    constraint = gtok.constraint(JSON_OBJECT_SCHEMA)
    first = allowed_ids(constraint)
    assert first
    assert all(engine.tokenizer.decode([i]).startswith("{") for i in first)
    assert 0 not in first
    assert not constraint.allows_eos and not constraint.is_finished


def test_a_forbidden_token_is_a_violation(engine: Engine, gtok: GrammarTokenizer) -> None:
    constraint = gtok.constraint(JSON_OBJECT_SCHEMA)
    (letter,) = encode(engine, "x")
    with pytest.raises(ConstraintViolated, match=f"token {letter} refused"):
        constraint.accept(letter)
    with pytest.raises(ConstraintViolated):  # the error state is permanent
        constraint.allowed_row(1024)


def test_a_complete_document_allows_only_eos_and_ends_with_stop(
    engine: Engine, gtok: GrammarTokenizer
) -> None:
    constraint = gtok.constraint(schema_text(PERSON))
    ids = encode(engine, PERSON_TEXT)
    feed(constraint, ids[:-1])
    assert not constraint.allows_eos and not constraint.is_finished
    assert 0 not in allowed_ids(constraint)
    constraint.accept(ids[-1])
    assert constraint.allows_eos and constraint.is_finished
    assert allowed_ids(constraint) == {0}
    assert engine.tokenizer.decode(ids) == PERSON_TEXT
    assert json.loads(PERSON_TEXT)["home"] == {"city": "Oslo"}

    # How the engine ends it: feed EOS to the request's TokenOutput, which reports "stop".
    out = TokenOutput(engine.tokenizer, SamplingParams(max_tokens=100), 5, engine.context_length)
    for token in ids:
        assert out.feed(token).finish_reason is None
    assert out.feed(constraint.eos_token).finish_reason == "stop"


def test_the_schema_is_enforced_inside_the_document(engine: Engine, gtok: GrammarTokenizer) -> None:
    constraint = gtok.constraint(schema_text(PERSON))
    feed(constraint, encode(engine, '{"name": "Tom", "kind": "'))
    texts = {engine.tokenizer.decode([i]) for i in allowed_ids(constraint)}
    assert texts and all("cat".startswith(t) or "dog".startswith(t) for t in texts)
    # maxLength 8: a ninth character of the name is refused, the closing quote is not.
    name = gtok.constraint(schema_text(PERSON))
    feed(name, encode(engine, '{"name": "abcdefgh'))
    closing = {engine.tokenizer.decode([i]) for i in allowed_ids(name)}
    assert closing and all(t.startswith('"') for t in closing)


def test_a_top_level_number_may_end_or_go_on(engine: Engine, gtok: GrammarTokenizer) -> None:
    constraint = gtok.constraint(schema_text({"type": "integer"}))
    feed(constraint, encode(engine, "12"))
    allowed = allowed_ids(constraint)
    assert constraint.allows_eos and not constraint.is_finished
    assert 0 in allowed and len(allowed) > 1


@pytest.mark.parametrize("shape", [(1, 1100), (1100,)])
def test_mask_pads_a_wider_model_vocabulary(
    engine: Engine, gtok: GrammarTokenizer, shape: tuple[int, ...]
) -> None:
    constraint = gtok.constraint(JSON_OBJECT_SCHEMA)
    logits = mx.ones(shape, dtype=mx.bfloat16)
    masked = constraint.mask(logits)
    assert masked.shape == logits.shape and masked.dtype == mx.bfloat16
    row = np.array(masked.astype(mx.float32)).reshape(-1)
    finite = {int(i) for i in np.flatnonzero(np.isfinite(row))}
    assert finite == allowed_ids(constraint)
    assert np.all(np.isneginf(row[1024:]))
    assert finite and cast(int, mx.argmax(masked, axis=-1).item()) in finite
    with pytest.raises(ValueError, match="one row expected"):
        constraint.mask(mx.ones((2, 1100)))


def test_a_generated_model_with_a_padded_vocabulary_works(
    model_dir: Path, tmp_path: Path, gtok: GrammarTokenizer
) -> None:
    path = write_generated_model(tmp_path / "m", ModelShape(vocab_size=1100), model_dir)
    engine = Engine.load(path, lambda n, total: None)
    assert engine.vocab_size == 1100
    constraint = grammar_tokenizer(engine.tokenizer).constraint(schema_text(PERSON))
    logits = engine.model(mx.array(encode(engine, "hello"))[None])[:, -1, :]
    masked = constraint.mask(logits)
    token = cast(int, mx.argmax(masked, axis=-1).item())
    assert token in allowed_ids(gtok.constraint(schema_text(PERSON)), 1100)
    constraint.accept(token)


def test_the_directory_and_the_loaded_tokenizer_agree(
    engine: Engine, model_dir: Path, gtok: GrammarTokenizer
) -> None:
    from_dir = GrammarTokenizer.from_directory(model_dir, [0])
    ids = encode(engine, PERSON_TEXT)
    a, b = from_dir.constraint(schema_text(PERSON)), gtok.constraint(schema_text(PERSON))
    for token in ids:
        assert np.array_equal(a.allowed_row(1024), b.allowed_row(1024))
        a.accept(token)
        b.accept(token)
    assert a.is_finished and b.is_finished


def test_a_tokenizer_without_a_tokenizers_backend_is_refused(tmp_path: Path) -> None:
    class Slow:
        _tokenizer = object()
        eos_token_ids = {0}

    with pytest.raises(GrammarUnavailable, match="no tokenizers backend"):
        GrammarTokenizer.from_wrapper(Slow())  # type: ignore[arg-type]
    with pytest.raises(GrammarUnavailable, match=r"no tokenizer\.json"):
        GrammarTokenizer.from_directory(tmp_path, [0])
    with pytest.raises(GrammarUnavailable, match="no EOS"):
        GrammarTokenizer.from_json("{}", [])


def test_a_refused_schema_is_a_schema_error_in_the_runner_too(gtok: GrammarTokenizer) -> None:
    with pytest.raises(SchemaRefused) as caught:
        gtok.constraint('{"type": "object", "not": {}}', param="format")
    assert caught.value.message == 'format: unsupported keyword "not"'


def test_constraints_from_one_compiled_schema_are_independent(
    engine: Engine, gtok: GrammarTokenizer
) -> None:
    a = gtok.constraint(schema_text(PERSON))
    first = allowed_ids(a)
    feed(a, encode(engine, '{"name": "'))
    b = gtok.constraint(schema_text(PERSON))  # from the cache
    assert allowed_ids(b) == first != allowed_ids(a)
    feed(b, encode(engine, PERSON_TEXT))
    assert b.is_finished and not a.is_finished


def test_rollback_restores_the_earlier_state(engine: Engine, gtok: GrammarTokenizer) -> None:
    constraint = gtok.constraint(schema_text(PERSON))
    ids = encode(engine, PERSON_TEXT)
    feed(constraint, ids[:5])
    before = constraint.allowed_row(1024)
    feed(constraint, ids[5:9])
    constraint.rollback(4)
    assert np.array_equal(constraint.allowed_row(1024), before)
    assert constraint.statistics().tokens == 5
    with pytest.raises(ValueError, match="cannot roll back 6 of 5"):
        constraint.rollback(6)


def test_draft_masks_follow_the_valid_prefix_and_leave_the_state(
    engine: Engine, gtok: GrammarTokenizer
) -> None:
    constraint = gtok.constraint(schema_text(PERSON))
    ids = encode(engine, PERSON_TEXT)
    feed(constraint, ids[:3])
    before = constraint.allowed_row(1024)
    (bad,) = encode(engine, "x")
    draft = [*ids[3:6], bad, ids[6]]
    k, rows = constraint.draft_masks(draft, 1024)
    assert k == 3 and rows.shape == (4, 1024)
    assert np.array_equal(rows[0], before)
    assert all(rows[i][draft[i]] for i in range(k)) and not rows[k][bad]
    assert np.array_equal(constraint.allowed_row(1024), before)
    feed(constraint, ids[3:])
    assert constraint.is_finished


def test_mask_rows_masks_only_constrained_rows(gtok: GrammarTokenizer) -> None:
    constraint = gtok.constraint(JSON_OBJECT_SCHEMA)
    logits = mx.zeros((3, 1100))
    masked = np.array(mask_rows(logits, [None, constraint, None]))
    assert np.all(masked[0] == 0) and np.all(masked[2] == 0)
    assert {int(i) for i in np.flatnonzero(np.isfinite(masked[1]))} == allowed_ids(constraint)
    assert mask_rows(logits, [None, None, None]) is logits
    with pytest.raises(ValueError, match="2 constraints for 3 rows"):
        mask_rows(logits, [None, None])


def test_a_constraint_made_on_a_worker_thread_works_on_this_one(
    engine: Engine, gtok: GrammarTokenizer
) -> None:
    # The runner prepares requests on a worker thread and decodes on its main thread.
    made: list[Constraint] = []
    worker = threading.Thread(target=lambda: made.append(gtok.constraint(schema_text(PERSON))))
    worker.start()
    worker.join()
    feed(made[0], encode(engine, PERSON_TEXT))
    assert made[0].is_finished
    stats = made[0].statistics()
    assert stats.tokens == len(encode(engine, PERSON_TEXT)) and stats.masks == 0


def test_a_forced_tool_call_is_wrapped_and_valid(engine: Engine, gtok: GrammarTokenizer) -> None:
    tools = {
        "get_weather": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        "add": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    }
    schema = schema_text(tool_call_schema(tools))
    constraint = gtok.constraint(schema, before="<tool_call>\n", after="\n</tool_call>")
    call = '{"name": "add", "arguments": {"a": 2}}'
    feed(constraint, encode(engine, f"<tool_call>\n{call}\n</tool_call>"))
    assert constraint.is_finished
    wrong = gtok.constraint(schema, before="<tool_call>\n", after="\n</tool_call>")
    feed(wrong, encode(engine, '<tool_call>\n{"name": "add", "arguments": {"'))
    (c,) = encode(engine, "c")
    assert not wrong.allowed_row(1024)[c]  # "add" takes "a", not "city"
    unwrapped = gtok.constraint(schema)
    with pytest.raises(ConstraintViolated):
        unwrapped.accept(encode(engine, "<")[0])


def test_a_special_token_in_the_wrapper_must_be_that_token(
    engine: Engine, gtok: GrammarTokenizer
) -> None:
    constraint = gtok.constraint(schema_text({"type": "integer"}), before="<|tool|>\n")
    assert allowed_ids(constraint) == {4}  # <|tool|> as the special token, not its letters
    feed(constraint, encode(engine, "<|tool|>\n12"))
    assert constraint.allows_eos


def test_the_tool_call_schema_names_one_or_any_tool() -> None:
    one = tool_call_schema({"f": {"type": "object"}})
    assert one["properties"] == {"name": {"const": "f"}, "arguments": {"type": "object"}}
    both: Any = tool_call_schema({"f": {"type": "object"}, "g": {"type": "object"}})
    assert [c["properties"]["name"] for c in both["anyOf"]] == [{"const": "f"}, {"const": "g"}]
    with pytest.raises(ValueError, match="no tools"):
        tool_call_schema({})
