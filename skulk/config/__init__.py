"""Node configuration: defaults, overridden by ``SKULK_*`` environment, overridden by flags.

Each option is declared once in ``_options.OPTIONS`` (flag, environment variable, type, help,
check); its default is the matching :class:`ServeConfig` field. ``docs/operations.md`` lists them
all. The tour:

- :class:`ServeConfig`: a node's settings, and the runner, restart, route and link settings
  built from them (``_serve``);
- :func:`add_serve_arguments` / :func:`serve_config`: the command line and environment read
  into one, each value checked (``_options``, ``_checks``);
- :class:`ByteSize`, :func:`default_compute_ports` and the defaults: the values settings are made
  of (``_values``).
"""

from skulk.config._options import add_serve_arguments, serve_config
from skulk.config._serve import ServeConfig
from skulk.config._values import (
    COMPUTE_PORTS_COUNT,
    DEFAULT_PORT,
    DISABLED_DEADLINE,
    LINK_HEARTBEAT,
    ROUTE_KEEPALIVE,
    ByteSize,
    default_compute_ports,
)

__all__ = [
    "COMPUTE_PORTS_COUNT",
    "DEFAULT_PORT",
    "DISABLED_DEADLINE",
    "LINK_HEARTBEAT",
    "ROUTE_KEEPALIVE",
    "ByteSize",
    "ServeConfig",
    "add_serve_arguments",
    "default_compute_ports",
    "serve_config",
]
