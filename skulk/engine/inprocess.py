"""The engine in this process, for benchmarks and in-process references: the model and the
decode path a runner serves with (:func:`decode_alone` is a request alone in the serving batch),
without the runner process. Importing it imports mlx; the node never does.
"""

from skulk.engine._engine import Engine, TokenOutput
from skulk.engine._sampling import Sampler
from skulk.engine._single import decode_alone, warm_up
from skulk.engine._speculate import SpeculativeDecoder
from skulk.engine._speculation_control import (
    DEFAULT_SPECULATIVE_TOKENS,
    SpeculationController,
    SpeculationStatistics,
)

__all__ = [
    "DEFAULT_SPECULATIVE_TOKENS",
    "Engine",
    "Sampler",
    "SpeculationController",
    "SpeculationStatistics",
    "SpeculativeDecoder",
    "TokenOutput",
    "decode_alone",
    "warm_up",
]
