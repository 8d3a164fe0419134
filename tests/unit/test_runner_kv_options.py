"""The KV budget and prefix cache seen from outside the runner: node flags, the ``Load`` frame,
the API's answers to the runner's budget refusals and the ``cached_tokens`` usage field."""

from __future__ import annotations

import argparse

import pytest

from skulk.api._openai_format import usage_object
from skulk.api._stream import failure_error_for
from skulk.config import ServeConfig, add_serve_arguments, serve_config
from skulk.engine.protocol import FROM_RUNNER, TO_RUNNER
from skulk.wire.runner import Finished, GenerationEnd, Load, Usage
from skulk.worker import RequestFailure


def parse(*argv: str, env: dict[str, str] | None = None) -> ServeConfig:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return serve_config(parser.parse_args(list(argv)), env or {})


def test_kv_and_prefix_cache_flags_reach_the_runners_load() -> None:
    config = parse("--kv-cache-memory", "1.5G", "--prefix-cache-memory", "0", "--max-queue", "9")
    runner = config.runner_config()
    assert runner.kv_cache_bytes == 3 << 29
    assert runner.prefix_cache_bytes == 0
    assert runner.kv_waiting == 9
    env = parse(env={"SKULK_KV_CACHE_MEMORY": "512M"}).runner_config()
    assert env.kv_cache_bytes == 512 << 20 and env.prefix_cache_bytes is None
    defaults = parse().runner_config()
    assert defaults.kv_cache_bytes is None and defaults.prefix_cache_bytes is None


@pytest.mark.parametrize(
    ("flag", "value"), [("--kv-cache-memory", "0"), ("--prefix-cache-memory", "lots")]
)
def test_bad_sizes_are_refused_naming_the_flag(flag: str, value: str) -> None:
    with pytest.raises(ValueError, match=flag):
        parse(flag, value)


def test_load_and_usage_round_trip_with_and_without_the_new_fields() -> None:
    load = Load("/m", "m", kv_cache_bytes=1 << 30, prefix_cache_bytes=0, kv_waiting=3)
    assert TO_RUNNER.decode(TO_RUNNER.encode(load)) == load
    assert TO_RUNNER.decode(TO_RUNNER.encode(Load("/m", "m"))) == Load("/m", "m")
    done = Finished("r", GenerationEnd("stop", Usage(10, 2, cached_tokens=8)))
    assert FROM_RUNNER.decode(FROM_RUNNER.encode(done)) == done


def test_usage_reports_cached_prompt_tokens_as_openai_does() -> None:
    assert usage_object(Usage(10, 2, cached_tokens=8)) == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    assert "prompt_tokens_details" not in usage_object(Usage(10, 2))


def test_budget_refusals_are_a_429_and_a_400_naming_max_tokens() -> None:
    full = failure_error_for(RequestFailure("kv_cache_full", "busy"), "messages")
    assert full.status == 429 and full.headers == {"Retry-After": "1"}
    big = failure_error_for(RequestFailure("max_tokens_too_large", "at most 54"), "messages")
    assert big.status == 400 and big.param == "max_tokens" and big.code == "max_tokens_too_large"


def test_a_runner_stopped_under_a_request_is_a_503_to_retry_not_a_500() -> None:
    """Its instance was deleted or moved, or its node is shutting down: not the server's
    fault nor the request's, and a retry finds another instance."""
    gone = failure_error_for(RequestFailure("runner_stopped", "the runner was stopped"), "prompt")
    assert gone.status == 503 and gone.code == "runner_stopped"
    assert gone.headers == {"Retry-After": "1"} and gone.type == "server_error"
    crashed = failure_error_for(RequestFailure("runner_crashed", "exit 1"), "prompt")
    assert crashed.status == 500  # a crash is ours
