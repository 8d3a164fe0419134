"""``--route-idle-timeout`` and ``--link-liveness-timeout``: the two deadlines that notice a
serving node gone silent, their defaults (the hop's and the link's own), their checks, and 0
for "disabled" (a deadline that never fires in practice; only for repro --break runs)."""

from __future__ import annotations

import argparse

import pytest

from skulk.config import (
    DISABLED_DEADLINE,
    LINK_HEARTBEAT,
    ROUTE_KEEPALIVE,
    ServeConfig,
    add_serve_arguments,
    serve_config,
)
from skulk.federation import LinkConfig
from skulk.routing import RouteTimeouts


def parse(argv: list[str], env: dict[str, str] | None = None) -> ServeConfig:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return serve_config(parser.parse_args(argv), env or {})


def test_the_defaults_are_the_hop_and_the_link_defaults() -> None:
    config = parse([])
    assert config.route_timeouts() == RouteTimeouts()
    assert config.link_config() == LinkConfig()
    assert (ROUTE_KEEPALIVE, LINK_HEARTBEAT) == (
        RouteTimeouts().keepalive,
        LinkConfig().heartbeat_interval,
    )


def test_flags_and_environment_set_them() -> None:
    config = parse(["--route-idle-timeout", "4"], {"SKULK_LINK_LIVENESS_TIMEOUT": "7.5"})
    assert config.route_timeouts().idle == 4.0
    assert config.link_config().liveness_timeout == 7.5


def test_zero_disables_them() -> None:
    config = parse(["--route-idle-timeout", "0", "--link-liveness-timeout", "0"])
    assert config.route_timeouts().idle == DISABLED_DEADLINE
    assert config.link_config().liveness_timeout == DISABLED_DEADLINE


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--route-idle-timeout", "2"),  # not above the keepalive: a silent stream is normal
        ("--route-idle-timeout", "-1"),
        ("--route-idle-timeout", "inf"),
        ("--link-liveness-timeout", "1"),  # not above the heartbeat
        ("--link-liveness-timeout", "nan"),
    ],
)
def test_values_that_would_give_up_healthy_peers_are_refused(flag: str, value: str) -> None:
    with pytest.raises(ValueError, match=flag):
        parse([flag, value])
