"""The pieces of a sharded runner that need no compute group: the messages of rank 0, the
collective watchdog and its trace, which tensors a pipeline rank loads (and what that costs in
memory), and the refusals of shardings a model cannot do."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from skulk.engine import _ops as ops
from skulk.engine._watchdog import (
    COLLECTIVE_TIMEOUT_EXIT_CODE,
    TRACE_ROUTINE,
    CollectiveWatchdog,
)
from skulk.engine.faults import Fault, Faults, FaultSpecError
from skulk.models import ensure_demo_model
from skulk.models._generated import ModelShape, write_generated_model
from skulk.models._shards import ShardSlice, needed_tensors
from skulk.wire.runner import CollectiveEntry, CollectiveTimeout, FromRunner, ShardSpec

# ---- the messages rank 0 sends along the ring ----------------------------------------------

OPS: list[ops.Op] = [
    ops.New(1),
    ops.Forward(1, rows=1, length=512, back=False),
    ops.Forward(0, rows=3, length=9, back=True),
    ops.Join(0, 0, 1, 1),
    ops.Join(1, 1, 2, 3),
    ops.Drop(3, rows=2, index=1, rest=4, own=5),
    ops.Drop(4, rows=1, index=0, rest=0, own=0),
    ops.Trim(5, 7),
    ops.Keep(5, 100, 6),
    ops.Copy(6, 99, 7),
    ops.Free(2**31 - 1),
    ops.Measure(9),
    ops.Warmed(),
    ops.Shutdown(),
]


def test_every_op_round_trips_in_one_message() -> None:
    words = ops.encode(OPS)
    assert all(-(2**31) <= v < 2**31 for v in words)  # fits int32
    assert ops.decode(words) == OPS
    assert ops.decode([]) == []


def test_a_header_round_trips_and_one_for_another_message_or_garbage_is_refused() -> None:
    header = ops.Header(2**31 + 5, 40, idle_ms=64, echo=True)
    words = ops.encode_header(header)
    assert len(words) == ops.HEADER_SIZE
    assert ops.decode_header(words, 2**31 + 5) == header
    with pytest.raises(ops.OpsError, match="arrived as message"):
        ops.decode_header(words, 6)
    with pytest.raises(ops.OpsError, match="not a message header"):
        ops.decode_header([0] * ops.HEADER_SIZE, 0)
    twice = [2 * v for v in ops.encode_header(ops.Header(0, 0))]  # e.g. two ranks summed
    with pytest.raises(ops.OpsError):
        ops.decode_header(twice, 0)


def test_a_payload_cut_short_or_with_an_unknown_op_is_refused() -> None:
    words = ops.encode([ops.Drop(3, 2, 1, 4, 5)])
    with pytest.raises(ops.OpsError, match="cut short"):
        ops.decode(words[:-1])
    with pytest.raises(ops.OpsError, match="unknown op code 99"):
        ops.decode([99, 1])


# ---- the watchdog ------------------------------------------------------------------------------


def test_watchdog_reports_the_collective_and_step_then_exits() -> None:
    sent: list[FromRunner] = []
    exited = threading.Event()
    codes: list[int] = []

    def exit(code: int) -> None:
        codes.append(code)
        exited.set()

    dog = CollectiveWatchdog(lambda frame, within: sent.append(frame) or True, exit)
    with dog.guard("all_sum(control)", 3, 5.0):
        pass  # in time: leaves an entry, no alarm
    with dog.guard("forward(decode)", 57, 0.2):
        assert exited.wait(10)  # stands in for an evaluation a stopped peer never completes
    assert codes == [COLLECTIVE_TIMEOUT_EXIT_CODE]
    (frame,) = sent
    assert isinstance(frame, CollectiveTimeout)
    assert (frame.collective, frame.step, frame.seconds) == ("forward(decode)", 57, 0.2)
    assert [e.collective for e in frame.recent] == ["all_sum(control)"]


def test_trace_keeps_every_detailed_entry_and_the_latest_routine_ones() -> None:
    dog = CollectiveWatchdog(lambda frame, within: True, lambda code: None)
    for step in range(100):
        dog.record(CollectiveEntry(float(step), "all_sum(control)", step, 0.001))
        if step in (3, 50):
            dog.record(CollectiveEntry(step + 0.5, "all_sum(control)", step, 0.001, "free 1"))
    trace = dog.take_trace()
    assert trace is not None
    assert trace.dropped == 100 - TRACE_ROUTINE
    assert [e.at for e in trace.entries] == sorted(e.at for e in trace.entries)
    assert [e.detail for e in trace.entries if e.detail] == ["free 1", "free 1"]
    assert len(trace.entries) == TRACE_ROUTINE + 2
    assert dog.take_trace() is None


# ---- fault hooks for sharded runners ----------------------------------------------------------


def test_connect_and_prefill_fault_phases() -> None:
    faults = Faults.parse("hang@connect#1; slow@prefill:0.5; crash@prefill:2", 1)
    assert faults.items == (
        Fault("hang", "connect", 0.0, 1),
        Fault("slow", "prefill", 0.5),
        Fault("crash", "prefill", 2.0),
    )
    with pytest.raises(FaultSpecError, match="decode, prefill and exit"):
        Faults.parse("slow@connect:1", 1)


# ---- loading a shard ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


def spec(sharding: str, rank: int, start: int, end: int, world: int = 2) -> ShardSpec:
    hosts = tuple(f"127.0.0.1:{1000 + r}" for r in range(world))
    return ShardSpec(sharding, rank, hosts, start, end, 1.0, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("tied", [False, True])
def test_a_pipeline_rank_keeps_exactly_the_tensors_it_needs(
    demo: Path, tmp_path: Path, tied: bool
) -> None:
    from mlx.utils import tree_flatten

    from skulk.engine._shard import load_shard, open_model

    shape = ModelShape(layers=4, tie_word_embeddings=tied)
    model_dir = write_generated_model(tmp_path / "m", shape, demo, files=2)
    for rank, (start, end) in enumerate([(0, 1), (1, 3), (3, 4)]):
        model, config = open_model(model_dir)
        part = ShardSlice("pipeline", start, end, 4)
        params = tree_flatten(model.parameters())
        names = set(needed_tensors([n for n, _ in params], part))
        want = [v for n, v in params if n in names]
        shard = load_shard(
            model, config, spec("pipeline", rank, start, end, 3), None, lambda n, t: None
        )
        held = [v for _, v in tree_flatten(shard.model.parameters())]
        assert sorted(map(id, held)) == sorted(map(id, want)), rank


def test_a_pipeline_rank_holds_about_its_share_of_the_weights(demo: Path, tmp_path: Path) -> None:
    """Weights read lazily, only the shard's: each rank of a 2-stage pipeline grows by about
    half of what loading the whole model grows (measured in fresh processes)."""
    shape = ModelShape(layers=8, hidden_size=512, heads=8, kv_heads=4, intermediate_size=1408)
    model_dir = write_generated_model(tmp_path / "big", shape, demo, files=3)
    code = """
import gc, sys
from pathlib import Path
import mlx.core as mx
from skulk.engine._link import rss
from skulk.engine._shard import load_shard, open_model
from skulk.wire.runner import ShardSpec
mode, path = sys.argv[1], Path(sys.argv[2])
base = rss()
model, config = open_model(path)
if mode == "full":
    mx.eval(model.parameters())
else:
    r = int(mode)
    spec = ShardSpec("pipeline", r, ("127.0.0.1:1", "127.0.0.1:2"), 4 * r, 4 * r + 4, 1, 1)
    load_shard(model, config, spec, None, lambda n, total: None)
gc.collect()
print(rss() - base)
"""

    def growth(mode: str) -> int:
        argv = [sys.executable, "-c", code, mode, str(model_dir)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
        return int(done.stdout.strip())

    full = growth("full")
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    assert full > 0.8 * weights  # the weights dominate what loading costs
    for rank in ("0", "1"):
        share = growth(rank)
        print(f"rank {rank}: {share >> 20} MiB of {full >> 20} MiB for the whole model")
        assert share < 0.75 * full


# ---- refusals --------------------------------------------------------------------------------


def fake_model(shard: bool) -> SimpleNamespace:
    inner = SimpleNamespace(layers=[object()] * 4, embed_tokens=object(), norm=object())
    model = SimpleNamespace(model=inner)
    if shard:
        model.shard = lambda group: None
    return model


def test_tensor_sharding_needs_shard_and_divisible_heads() -> None:
    from skulk.engine._shard import ShardingUnsupported, check_sharding

    config = {"model_type": "mamba", "num_attention_heads": 4, "intermediate_size": 128}
    with pytest.raises(ShardingUnsupported, match="mamba model has no shard"):
        check_sharding(fake_model(shard=False), config, spec("tensor", 0, 0, 4))
    config["model_type"] = "llama"
    config["num_key_value_heads"] = 2
    check_sharding(fake_model(shard=True), config, spec("tensor", 0, 0, 4))  # 4 and 2 by 2
    with pytest.raises(ShardingUnsupported, match="4 heads, 2 key/value heads"):
        check_sharding(fake_model(shard=True), config, spec("tensor", 0, 0, 4, world=4))
    with pytest.raises(ShardingUnsupported, match=r"not \[0, 3\)"):
        check_sharding(fake_model(shard=True), config, spec("tensor", 0, 0, 3))


def test_pipeline_layers_must_be_a_slice_and_the_group_two_ranks() -> None:
    from skulk.engine._shard import ShardingUnsupported, check_sharding

    config = {"model_type": "llama"}
    check_sharding(fake_model(shard=False), config, spec("pipeline", 1, 2, 4))
    with pytest.raises(ShardingUnsupported, match=r"\[3, 6\) are not a slice of the 4"):
        check_sharding(fake_model(shard=False), config, spec("pipeline", 1, 3, 6))
    with pytest.raises(ShardingUnsupported, match="at least 2 ranks"):
        check_sharding(fake_model(shard=False), config, spec("pipeline", 0, 0, 4, world=1))
    no_layers = SimpleNamespace(model=SimpleNamespace())
    with pytest.raises(ShardingUnsupported, match=r"no model\.model"):
        check_sharding(no_layers, config, spec("pipeline", 0, 0, 2))
