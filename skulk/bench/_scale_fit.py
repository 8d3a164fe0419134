"""How a control-plane figure grows with the number of nodes: least-squares fits and their
extrapolation (pure: numbers in, numbers out; ``python -m skulk.bench scale`` feeds it).

Each figure measured at sizes ``N`` (say 3, 5, 10, 20 nodes) is fitted as ``y = a + b·f(N)`` for
every growth model ``f`` in :data:`MODELS` (``log N``, ``N``, ``N log N``, ``N²``); the model
with the smallest squared error wins and says what the figure would be at 100 and 1000 nodes.
A tie (two sizes only, or a flat figure) goes to the faster-growing model: for capacity
planning an overestimate is the safer mistake. Extrapolations are clamped at 0 (a noisy
falling time or size does not go negative). Alongside, :func:`growth_exponent` fits
``y = c·N^k`` on log-log axes: ``k`` near 1 is linear growth, near 2 quadratic, near 0 flat —
the number that tells whether something grows faster than linearly, whichever model wins.

Four points cannot tell ``N log N`` from ``N`` with much confidence: read the exponent and the
runner-up's extrapolation as well (``candidates``), not the winner alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs
import numpy as np

#: The growth models, slowest first: name → f(N).
MODELS: dict[str, Callable[[float], float]] = {
    "log": math.log,
    "linear": lambda n: n,
    "n_log_n": lambda n: n * math.log(n),
    "quadratic": lambda n: n * n,
}


@attrs.frozen
class ModelFit:
    """``y = a + b·f(N)`` for the model ``name``: its coefficients and squared error."""

    name: str
    a: float
    b: float
    sse: float

    def at(self, n: float) -> float:
        return self.a + self.b * MODELS[self.name](n)


@attrs.frozen
class Fit:
    """The best :class:`ModelFit` of a figure, every candidate, the log-log exponent (``None``
    when a value is not positive) and the best model's values at the extrapolation sizes."""

    best: ModelFit
    candidates: tuple[ModelFit, ...]
    exponent: float | None
    r2: float
    extrapolated: dict[int, float]

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.best.name,
            "a": _round(self.best.a),
            "b": _round(self.best.b),
            "r2": round(self.r2, 4),
            "exponent": None if self.exponent is None else round(self.exponent, 3),
            "at": {str(n): _round(v) for n, v in self.extrapolated.items()},
            "candidates": {
                c.name: {str(n): _round(max(0.0, c.at(n))) for n in self.extrapolated}
                for c in self.candidates
            },
        }


def fit_model(name: str, sizes: Sequence[float], values: Sequence[float]) -> ModelFit:
    """Least squares of ``values = a + b·f(sizes)`` for the model ``name``."""
    x = np.array([MODELS[name](n) for n in sizes], dtype=float)
    y = np.array(values, dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    sse = float(np.sum((design @ np.array([a, b]) - y) ** 2))
    return ModelFit(name, float(a), float(b), sse)


def growth_exponent(sizes: Sequence[float], values: Sequence[float]) -> float | None:
    """``k`` of ``values ≈ c·sizes^k`` (least squares on log-log axes); ``None`` if any value
    is not positive or the sizes do not differ."""
    if any(v <= 0 for v in values) or len(set(sizes)) < 2:
        return None
    x, y = np.log(np.array(sizes, dtype=float)), np.log(np.array(values, dtype=float))
    k, _ = np.polyfit(x, y, 1)
    return float(k)


def fit(
    sizes: Sequence[float], values: Sequence[float], extrapolate: Sequence[int] = (100, 1000)
) -> Fit:
    """Fit every model of :data:`MODELS` to ``values`` measured at ``sizes``; the best one (the
    least squared error, the faster-growing model on a tie) extrapolated to ``extrapolate``
    (at least 0). Needs at least two distinct sizes."""
    if len(sizes) != len(values):
        raise ValueError(f"{len(sizes)} sizes but {len(values)} values")
    if len(set(sizes)) < 2:
        raise ValueError("fitting needs at least two distinct sizes")
    if any(n < 1 for n in sizes):
        raise ValueError(f"sizes are node counts (>= 1), not {list(sizes)}")
    candidates = tuple(fit_model(name, sizes, values) for name in MODELS)
    # A relative tolerance: fits within 1e-9 of the best are ties (exact data, rounding).
    least = min(c.sse for c in candidates)
    best = next(c for c in reversed(candidates) if c.sse <= least + 1e-9 * (1 + least))
    y = np.array(values, dtype=float)
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 if total == 0 else 1.0 - best.sse / total
    return Fit(
        best,
        candidates,
        growth_exponent(sizes, values),
        r2,
        {n: max(0.0, best.at(n)) for n in extrapolate},
    )


def _round(value: float) -> float:
    """Four significant digits (figures span bytes to megabytes)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, 3 - math.floor(math.log10(abs(value))))
