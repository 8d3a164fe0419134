"""``--election-timeout`` (the Raft election timeout, in driver ticks), ``--raft-segment-bytes``
and ``--advertise`` (the address gossiped for other nodes to dial): their defaults, what they
become, and their checks."""

from __future__ import annotations

import argparse

import pytest

from skulk.config import ServeConfig, add_serve_arguments, serve_config
from skulk.consensus import DriverConfig, RaftConfig


def parse(argv: list[str], env: dict[str, str] | None = None) -> ServeConfig:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return serve_config(parser.parse_args(argv), env or {})


def test_the_default_is_the_drivers_own() -> None:
    config = parse([])
    assert config.raft_config() == DriverConfig()
    assert config.advertise == ""


def test_the_election_timeout_counts_in_ticks() -> None:
    config = parse(["--election-timeout", "2"])
    driver = config.raft_config()
    assert driver.raft.election_ticks * driver.tick_seconds == pytest.approx(2.0)
    assert driver.raft.heartbeat_ticks == RaftConfig().heartbeat_ticks
    env = parse([], {"SKULK_ELECTION_TIMEOUT": "3600"}).raft_config()
    assert env.raft.election_ticks == 72000


@pytest.mark.parametrize("value", ["0.2", "0", "-1", "inf", "nan"])
def test_an_election_timeout_a_healthy_leader_would_miss_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="--election-timeout"):
        parse(["--election-timeout", value])


def test_advertise_takes_a_join_url() -> None:
    assert parse(["--advertise", "ws://127.0.0.1:4000"]).advertise == "ws://127.0.0.1:4000"
    assert parse([], {"SKULK_ADVERTISE": "wss://node.example:443"}).advertise == (
        "wss://node.example:443"
    )


@pytest.mark.parametrize("value", ["127.0.0.1:4000", "http://127.0.0.1:4000", "ws://"])
def test_an_advertised_address_nobody_can_dial_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="--advertise"):
        parse(["--advertise", value])


def test_raft_segment_bytes_takes_sizes() -> None:
    from skulk.consensus import DEFAULT_SEGMENT_BYTES

    assert parse([]).raft_segment_bytes == DEFAULT_SEGMENT_BYTES
    assert parse(["--raft-segment-bytes", "512K"]).raft_segment_bytes == 512 * 1024
    assert parse(["--raft-segment-bytes", "1"]).raft_segment_bytes == 1
    with pytest.raises(ValueError, match="--raft-segment-bytes"):
        parse(["--raft-segment-bytes", "0"])
