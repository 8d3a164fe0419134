"""Node configuration: defaults, overridden by ``SKULK_*`` environment, overridden by flags."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

import attrs

DEFAULT_PORT = 52415
DEFAULT_MODEL = "skulk-demo"


def default_home(env: Mapping[str, str]) -> Path:
    """``$SKULK_HOME``, else ``$XDG_DATA_HOME/skulk``, else ``~/.local/share/skulk``."""
    if home := env.get("SKULK_HOME"):
        return Path(home).expanduser()
    xdg = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "skulk"


@attrs.frozen
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    home: Path = attrs.field(factory=lambda: default_home(os.environ))
    model: str = DEFAULT_MODEL
    log_level: str = "info"
    hello_timeout: float = 30.0
    load_timeout: float = 600.0
    shutdown_grace: float = 5.0
    stream_interval: float = 0.02


# flag name → (env var, type, help)
_OPTIONS: dict[str, tuple[str, type, str]] = {
    "host": ("SKULK_HOST", str, "address the HTTP API binds (default 127.0.0.1)"),
    "port": ("SKULK_PORT", int, f"HTTP API port, 0 for any free port (default {DEFAULT_PORT})"),
    "home": ("SKULK_HOME", Path, "data directory (default ~/.local/share/skulk)"),
    "model": (
        "SKULK_MODEL",
        str,
        f"model to serve: a name or an mlx-lm directory (default {DEFAULT_MODEL})",
    ),
    "log_level": ("SKULK_LOG_LEVEL", str, "debug, info, warning or error (default info)"),
    "hello_timeout": ("SKULK_HELLO_TIMEOUT", float, "seconds a new runner has to say hello"),
    "load_timeout": ("SKULK_LOAD_TIMEOUT", float, "seconds a runner has to load its model"),
    "stream_interval": (
        "SKULK_STREAM_INTERVAL",
        float,
        "seconds between streamed deltas after the first token; 0 sends every token at once "
        "(default 0.02)",
    ),
    "shutdown_grace": (
        "SKULK_SHUTDOWN_GRACE",
        float,
        "seconds between SIGTERM and SIGKILL when stopping a runner",
    ),
}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    for name, (env, _, help_text) in _OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, help=f"{help_text} [{env}]")


def serve_config(args: argparse.Namespace, env: Mapping[str, str]) -> ServeConfig:
    """Build the config; raises ``ValueError`` naming the flag or variable that is wrong."""
    values: dict[str, object] = {}
    for name, (var, kind, _) in _OPTIONS.items():
        raw, source = getattr(args, name, None), "--" + name.replace("_", "-")
        if raw is None:
            raw, source = env.get(var), var
        if raw is None:
            continue
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{source}: expected {kind.__name__}, got {raw!r}") from None
        values[name] = value.expanduser() if isinstance(value, Path) else value
    if "home" not in values:
        values["home"] = default_home(env)
    port = values.get("port", DEFAULT_PORT)
    assert isinstance(port, int)
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port}")
    for name in ("hello_timeout", "load_timeout", "shutdown_grace", "stream_interval"):
        number = values.get(name, 0.0)
        assert isinstance(number, float)
        if not 0 <= number < float("inf"):
            raise ValueError(f"{name.replace('_', ' ')} must be a finite number >= 0, got {number}")
    level = values.get("log_level", "info")
    if level not in ("debug", "info", "warning", "error"):
        raise ValueError(f"log level must be debug, info, warning or error, got {level!r}")
    return ServeConfig(**values)  # type: ignore[arg-type]
