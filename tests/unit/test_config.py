from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from skulk.config import (
    COMPUTE_PORTS_COUNT,
    DEFAULT_PORT,
    ServeConfig,
    add_serve_arguments,
    default_compute_ports,
    serve_config,
)
from skulk.telemetry import DEFAULT_FANOUT


def parse(argv: list[str], env: dict[str, str] | None = None) -> ServeConfig:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return serve_config(parser.parse_args(argv), env or {})


def test_defaults_need_no_configuration() -> None:
    config = parse([], {"HOME": "/home/u"})
    assert config.host == "127.0.0.1"
    assert config.port == DEFAULT_PORT == 52415
    assert config.model == "skulk-demo"
    assert config.home == Path.home() / ".local" / "share" / "skulk"


def test_env_overrides_defaults_and_flags_override_env() -> None:
    env = {"SKULK_PORT": "6000", "SKULK_HOME": "/data/skulk", "SKULK_MODEL": "m"}
    config = parse([], env)
    assert (config.port, config.home, config.model) == (6000, Path("/data/skulk"), "m")
    config = parse(["--port", "7000", "--model", "other"], env)
    assert (config.port, config.home, config.model) == (7000, Path("/data/skulk"), "other")


def test_every_option_has_a_flag_and_env_and_a_config_field() -> None:
    config = parse(
        ["--progress-timeout", "0", "--runner-faults", "hang@decode:3#1", "--restart-limit", "2"],
        {"SKULK_WARMUP_TIMEOUT": "7.5"},
    )
    assert config.progress_timeout == 0.0  # 0 disables the deadline
    assert config.runner_faults == "hang@decode:3#1"
    assert config.restart_limit == 2
    assert config.warmup_timeout == 7.5


def test_log_lines_are_text_unless_json_is_asked_for() -> None:
    assert parse([]).log_format == "text"
    assert parse(["--log-format", "json"]).log_format == "json"
    assert parse([], {"SKULK_LOG_FORMAT": "json"}).log_format == "json"


def test_xdg_data_home_is_respected() -> None:
    assert parse([], {"XDG_DATA_HOME": "/xdg"}).home == Path("/xdg/skulk")


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--port", "http"], {}, "--port"),
        ([], {"SKULK_PORT": "x"}, "SKULK_PORT"),
        (["--port", "70000"], {}, "--port"),
        (["--log-level", "loud"], {}, "--log-level"),
        (["--log-format", "yaml"], {}, "--log-format"),
        ([], {"SKULK_LOG_FORMAT": "JSON lines"}, "SKULK_LOG_FORMAT"),
        (["--load-timeout", "soon"], {}, "--load-timeout"),
        (["--progress-timeout", "-1"], {}, "--progress-timeout"),
        (["--cancel-timeout", "0"], {}, "--cancel-timeout"),
        (["--restart-limit", "1.5"], {}, "--restart-limit"),
        ([], {"SKULK_RUNNER_FAULTS": "explode@load"}, "SKULK_RUNNER_FAULTS"),
    ],
)
def test_bad_values_name_their_source(argv: list[str], env: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse(argv, env)


def test_tls_options(tmp_path: Path) -> None:
    cert, key, ca = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    for path in (cert, key, ca):
        path.write_text("x")
    flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca)]
    config = parse([*flags, "--join", "wss://10.0.0.2:52416"])
    assert (config.tls_cert, config.tls_key, config.tls_ca) == (cert, key, ca)
    assert parse([], {"SKULK_TLS_CA": str(ca)}).tls_ca == ca
    assert parse([]).tls_cert is None
    with pytest.raises(ValueError, match="--tls-cert: expected an existing file"):
        parse(["--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", str(key)])
    with pytest.raises(ValueError, match="SKULK_TLS_KEY: expected an existing file"):
        parse([], {"SKULK_TLS_KEY": str(tmp_path)})
    with pytest.raises(ValueError, match="--tls-cert needs --tls-key"):
        parse(["--tls-cert", str(cert)])
    with pytest.raises(ValueError, match="--tls-key needs --tls-cert"):
        parse(["--tls-key", str(key)])
    with pytest.raises(ValueError, match="wss:// peer needs --tls-ca"):
        parse(["--join", "wss://10.0.0.2:52416"])


def test_which_model_a_node_makes_sure_the_cluster_has() -> None:
    # A founder with no flags serves the demo model; a joining node left at the default joins
    # as capacity; --model M (flag or environment) is ensured either way; "none" never.
    assert parse([]).ensured_model(founder=True) == "skulk-demo"
    assert parse([]).ensured_model(founder=False) is None
    assert parse(["--model", "skulk-demo"]).ensured_model(founder=False) == "skulk-demo"
    assert parse([], {"SKULK_MODEL": "m"}).ensured_model(founder=False) == "m"
    assert parse(["--model", "none"]).ensured_model(founder=True) is None


def test_cluster_flags_become_cluster_config_changes() -> None:
    assert parse([]).cluster_config_changes() == {}
    got = parse(["--node-down-after", "2.5", "--node-remove-after", "60"])
    assert got.cluster_config_changes() == {
        "node_down_after_ms": 2500,
        "node_remove_after_ms": 60000,
    }
    with pytest.raises(ValueError, match="--node-down-after"):
        parse(["--node-down-after", "0"])
    with pytest.raises(ValueError, match="--max-queue"):
        parse(["--max-queue", "0"])


def test_route_policy_flags() -> None:
    assert (parse([]).route_policy, parse([]).route_affinity_slack) == ("prefix", 4)
    got = parse(["--route-policy", "least-loaded", "--route-affinity-slack", "0"])
    assert (got.route_policy, got.route_affinity_slack) == ("least-loaded", 0)
    with pytest.raises(ValueError, match="--route-policy"):
        parse(["--route-policy", "nearest"])
    with pytest.raises(ValueError, match="--route-affinity-slack"):
        parse(["--route-affinity-slack", "-1"])


def test_memory_limit_takes_sizes_with_suffixes() -> None:
    assert parse([]).memory_limit is None
    assert parse(["--memory-limit", "512M"]).memory_limit == 512 * 1024 * 1024
    assert type(parse(["--memory-limit", "2G"]).memory_limit) is int  # exact, for the wire
    assert parse([], {"SKULK_MEMORY_LIMIT": "1.5GiB"}).memory_limit == 3 * 1024**3 // 2
    assert parse(["--memory-limit", "2g"]).memory_limit == 2 * 1024**3
    assert parse(["--memory-limit", "1000"]).memory_limit == 1000
    for bad in ("lots", "-1G", "0", "1.5.2G", "2X", "1e9"):
        with pytest.raises(ValueError, match="--memory-limit"):
            parse([f"--memory-limit={bad}"])


def test_compute_ports_default_from_the_federation_port_or_as_given() -> None:
    config = parse([])
    # The default --listen, and an OS-picked port in the ephemeral range: wrapped below it.
    assert config.compute_port_range(52416) == (21703, 21734)
    assert config.compute_port_range(53416) == (22703, 22734)
    # Nodes on one machine listen on different federation ports: their ranges differ too.
    assert config.compute_port_range(52448) == (21735, 21766)
    # A low federation port keeps the plain + 1000 while that stays below 32768 ...
    assert config.compute_port_range(8000) == (9000, 9031)
    assert config.compute_port_range(31736) == (32736, 32767)
    # ... and wraps to the bottom (never below 1024) past it; so do the highest ports.
    assert config.compute_port_range(31737) == (1024, 1055)
    assert config.compute_port_range(65535) == (3109, 3140)
    assert config.compute_port_range(1) == (32714, 32745)
    assert parse(["--compute-ports", "7000-7009"]).compute_port_range(52416) == (7000, 7009)
    for bad in ("7000", "7009-7000", "0-10", "7000-70000", "a-b", "7000:7009"):
        with pytest.raises(ValueError, match="--compute-ports"):
            parse(["--compute-ports", bad])


def test_default_compute_ports_lie_below_every_ephemeral_range_and_miss_the_federation_port() -> (
    None
):
    for port in range(1, 65536):
        first, last = default_compute_ports(port)
        assert last - first + 1 == COMPUTE_PORTS_COUNT
        # Linux's ephemeral range starts at 32768 by default; macOS/BSD/Windows' at 49152.
        assert 1024 <= first and last < 32768, port
        assert not first <= port <= last, port


def test_default_compute_ports_of_ports_a_range_apart_are_disjoint() -> None:
    # Any two OS-picked federation ports (Linux's default ephemeral range, 32768-60999) at
    # least COMPUTE_PORTS_COUNT apart give disjoint ranges: two nodes on one host never share
    # a default compute port. All pairs, by sorting on the first port: two ranges overlap
    # exactly when their first ports are less than COMPUTE_PORTS_COUNT apart.
    by_first = sorted((default_compute_ports(port)[0], port) for port in range(32768, 61000))
    overlapping = 0
    for i, (first, port) in enumerate(by_first):
        for other_first, other in by_first[i + 1 :]:
            if other_first - first >= COMPUTE_PORTS_COUNT:
                break
            overlapping += 1
            assert abs(other - port) < COMPUTE_PORTS_COUNT, (port, other)
    assert overlapping > 0  # the check saw neighbours (ports 1-31 apart do overlap)


def test_compute_host_defaults_to_the_listen_host_but_never_a_wildcard() -> None:
    config = parse([])
    assert config.compute_host_for("10.1.2.3") == "10.1.2.3"
    assert config.compute_host_for("0.0.0.0") not in ("", "0.0.0.0")
    assert parse(["--compute-host", "gpu7.lan"]).compute_host_for("0.0.0.0") == "gpu7.lan"
    for bad in ("0.0.0.0", "::", "a b"):
        with pytest.raises(ValueError, match="--compute-host"):
            parse(["--compute-host", bad])


def test_store_budget_takes_sizes_and_offline_is_a_bare_flag_or_a_switch() -> None:
    config = parse([])
    assert config.store_budget is None and config.offline is False
    config = parse(["--store-budget", "20G", "--offline"])
    assert config.store_budget == 20 * 1024**3 and config.offline is True
    config = parse([], {"SKULK_STORE_BUDGET": "512M", "SKULK_OFFLINE": "yes"})
    assert config.store_budget == 512 * 1024**2 and config.offline is True
    assert parse([], {"SKULK_OFFLINE": "off"}).offline is False
    with pytest.raises(ValueError, match="SKULK_OFFLINE"):
        parse([], {"SKULK_OFFLINE": "maybe"})
    with pytest.raises(ValueError, match="--store-budget"):
        parse(["--store-budget", "lots"])


def test_gossip_fanout_flag() -> None:
    assert parse([]).gossip_fanout == DEFAULT_FANOUT == 4
    assert parse(["--gossip-fanout", "0"]).gossip_fanout == 0  # every peer
    with pytest.raises(ValueError, match="--gossip-fanout"):
        parse(["--gossip-fanout", "-1"])
