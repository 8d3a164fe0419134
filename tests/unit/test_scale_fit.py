"""The scaling benchmark's fits (sans-IO): each growth model recovers exact data of its own
shape and extrapolates it, the log-log exponent tells linear from quadratic growth, ties go to
the faster-growing model, nothing extrapolates below zero, and bad input is refused."""

from __future__ import annotations

import math

import pytest

from skulk.bench._scale_fit import MODELS, fit, fit_model, growth_exponent

SIZES = (3, 5, 10, 20)


@pytest.mark.parametrize("name", list(MODELS))
def test_each_model_recovers_exact_data_of_its_shape(name: str) -> None:
    f = MODELS[name]
    values = [7.0 + 3.0 * f(n) for n in SIZES]
    got = fit(SIZES, values)
    assert got.best.name == name
    assert got.best.a == pytest.approx(7.0) and got.best.b == pytest.approx(3.0)
    assert got.r2 == pytest.approx(1.0)
    assert got.extrapolated[100] == pytest.approx(7.0 + 3.0 * f(100))
    assert got.extrapolated[1000] == pytest.approx(7.0 + 3.0 * f(1000))


def test_the_exponent_tells_linear_from_quadratic_growth() -> None:
    assert growth_exponent(SIZES, [2.0 * n for n in SIZES]) == pytest.approx(1.0)
    assert growth_exponent(SIZES, [0.5 * n * n for n in SIZES]) == pytest.approx(2.0)
    assert growth_exponent(SIZES, [4.0] * 4) == pytest.approx(0.0, abs=1e-9)
    assert growth_exponent(SIZES, [0.0, 1.0, 2.0, 3.0]) is None  # log of 0
    assert growth_exponent((5, 5), [1.0, 2.0]) is None


def test_a_flat_figure_ties_and_extrapolates_flat() -> None:
    got = fit(SIZES, [42.0] * 4)
    assert got.best.name == "quadratic"  # every model fits a constant exactly (b = 0)
    assert got.best.b == pytest.approx(0.0, abs=1e-9)
    assert got.extrapolated[1000] == pytest.approx(42.0)
    assert got.r2 == 1.0


def test_two_sizes_tie_and_the_fastest_growing_model_wins() -> None:
    got = fit((3, 5), [10.0, 20.0])  # every two-parameter model passes through two points
    assert got.best.name == "quadratic"
    assert got.extrapolated[100] > fit_model("linear", (3, 5), [10.0, 20.0]).at(100)


def test_a_falling_figure_is_not_extrapolated_below_zero() -> None:
    got = fit(SIZES, [9.0, 7.0, 4.0, 1.0])
    assert got.extrapolated[1000] == 0.0
    assert all(v >= 0 for c in got.as_dict()["candidates"].values() for v in c.values())  # type: ignore[attr-defined]


def test_noisy_quadratic_data_still_picks_a_superlinear_model() -> None:
    noise = (1.03, 0.97, 1.02, 0.99)
    values = [100.0 * n * (n - 1) * e for n, e in zip(SIZES, noise, strict=True)]
    got = fit(SIZES, values)
    assert got.best.name in ("n_log_n", "quadratic")
    assert got.exponent is not None and got.exponent > 1.5
    linear = fit_model("linear", SIZES, values)
    assert got.extrapolated[100] > linear.at(100)


def test_as_dict_carries_every_candidate_at_every_size() -> None:
    out = fit(SIZES, [float(n) for n in SIZES], (50, 100)).as_dict()
    assert out["model"] == "linear"
    assert out["at"] == {"50": 50.0, "100": 100.0}
    candidates = out["candidates"]
    assert isinstance(candidates, dict) and set(candidates) == set(MODELS)
    assert candidates["quadratic"]["100"] > 100
    assert math.isclose(out["exponent"], 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sizes", "values", "says"),
    [
        ((3, 5), (1.0,), "2 sizes but 1 values"),
        ((5, 5), (1.0, 2.0), "two distinct sizes"),
        ((0, 5), (1.0, 2.0), "node counts"),
    ],
)
def test_bad_input_is_refused(sizes: tuple[int, ...], values: tuple[float, ...], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        fit(sizes, values)
