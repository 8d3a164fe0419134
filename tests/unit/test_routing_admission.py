"""The serving node's admission bound (sans-IO)."""

from __future__ import annotations

import pytest

from skulk.routing import Admission, AdmissionStatistics, Overloaded


def test_admits_up_to_the_bound_per_instance_then_refuses_with_retry_after() -> None:
    admission = Admission(max_in_flight=2, retry_after=3.0)
    with admission.admit("i1"), admission.admit("i1"):
        assert admission.in_flight("i1") == 2
        with pytest.raises(Overloaded) as info, admission.admit("i1"):
            raise AssertionError("admitted beyond the bound")
        assert info.value.retry_after == 3.0 and info.value.instance == "i1"
        assert "2 requests in flight" in str(info.value)
        with admission.admit("i2"):  # another instance has places of its own
            assert admission.statistics() == AdmissionStatistics({"i1": 2, "i2": 1}, 3, 1, 2)
    assert admission.in_flight("i1") == 0
    assert admission.statistics() == AdmissionStatistics({}, 3, 1, 2)


def test_a_place_is_given_back_however_the_body_ends() -> None:
    admission = Admission(max_in_flight=1)
    with pytest.raises(ValueError), admission.admit("i1"):
        raise ValueError("the request failed")
    with admission.admit("i1"):  # the place is free again
        pass
    assert admission.statistics().in_flight == {}


def test_a_refused_request_holds_nothing() -> None:
    admission = Admission(max_in_flight=1)
    with admission.admit("i1"):
        for _ in range(3):
            with pytest.raises(Overloaded), admission.admit("i1"):
                pass
        assert admission.in_flight("i1") == 1
    assert admission.statistics().refused == 3 and admission.statistics().in_flight == {}


def test_defaults_and_bad_arguments() -> None:
    admission = Admission()
    assert admission.max_in_flight == 64 and admission.retry_after == 1.0
    for bad in (0, -1, True):
        with pytest.raises(ValueError):
            Admission(max_in_flight=bad)
    with pytest.raises(ValueError):
        Admission(retry_after=float("nan"))
