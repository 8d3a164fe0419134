from __future__ import annotations

import pytest

from skulk.engine.faults import Fault, Faults, FaultSpecError


def test_parse_items_and_incarnations() -> None:
    spec = "hang@decode:3#1; crash@load ;ignore-sigterm;slow@decode:0.25#2"
    first = Faults.parse(spec, incarnation=1)
    assert first.items == (Fault("hang", "decode", 3.0, 1), Fault("crash", "load"))
    assert first.ignore_sigterm
    second = Faults.parse(spec, incarnation=2)
    assert second.items == (Fault("crash", "load"), Fault("slow", "decode", 0.25, 2))


def test_empty_spec_means_no_faults() -> None:
    assert Faults.parse("", 1) == Faults()


@pytest.mark.parametrize(
    "spec",
    [
        "explode@load",
        "hang",
        "hang@nowhere",
        "hang@decode:x",
        "crash@load#0",
        "hang@decode#one",
        "slow@load:1",
        "hang@decode:-1",
    ],
)
def test_bad_specs_are_refused_naming_the_item(spec: str) -> None:
    with pytest.raises(FaultSpecError, match="bad fault"):
        Faults.parse(spec, 1)


def test_hit_ignores_other_phases_and_counts_below_the_threshold() -> None:
    faults = Faults.parse("crash@decode:3", 1)
    faults.hit("load")
    faults.hit("decode", 2)  # would exit the test process if it fired


def test_slow_applies_to_the_exit_of_a_rank() -> None:
    faults = Faults.parse("slow@exit:0.01", 1)
    assert [(f.action, f.phase, f.arg) for f in faults.items] == [("slow", "exit", 0.01)]
    faults.hit("exit")  # sleeps 10 ms, returns
