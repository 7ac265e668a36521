"""The engine model on an injected clock: admission, prefill/decode timing, preemption."""

from __future__ import annotations

from simulator.config import EngineConfig
from simulator.dialects import make_dialect
from simulator.engine import EngineModel
from simulator.faults import FaultBoard
from simulator.perf import PROFILES


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _engine(**cfg) -> tuple[EngineModel, Clock, list]:
    clock = Clock()
    config = EngineConfig(**cfg)
    events: list = []
    engine = EngineModel(
        config, make_dialect("vllm", "m", config.max_model_len), FaultBoard(), clock, seed=1
    )
    return engine, clock, events


def _run(engine: EngineModel, clock: Clock, steps: int = 10_000) -> int:
    done = 0
    for _ in range(steps):
        plan = engine.plan_step()
        if plan is None:
            break
        clock.now += plan.duration_s
        engine.finish_step(plan)
        done += 1
    return done


def _add(engine: EngineModel, prompt: int, out: int, sink: list) -> None:
    req = engine.new_request(
        f"r{len(sink)}", prompt, out, lambda n, r: sink.append((n, r)), ignore_eos=True
    )
    engine.add(req)


def test_prefill_time_grows_with_prompt_tokens_and_decode_with_batch():
    perf = PROFILES["llama2-70b/h100/tp4"]
    assert perf.prefill_ms(4000) > perf.prefill_ms(500) > 0
    assert perf.decode_ms(64) > perf.decode_ms(1) > 0
    # Whole-prompt prefill (chunked_prefill off) on the profile named above.
    engine, _, _ = _engine(chunked_prefill=False, profile="llama2-70b/h100/tp4")
    sink: list = []
    _add(engine, 2000, 2, sink)
    plan = engine.plan_step()
    assert plan is not None and plan.prefill_tokens == 2000
    assert abs(plan.duration_s - perf.prefill_ms(2000) / 1000) < 1e-9


def test_every_request_gets_exactly_its_tokens():
    engine, clock, _ = _engine()
    sink: list = []
    for out in (1, 5, 17):
        _add(engine, 100, out, sink)
    _run(engine, clock)
    assert sum(n for n, _ in sink) == 23
    assert [r for _, r in sink if r] == ["length"] * 3
    assert engine.used_blocks == 0 and not engine.running and not engine.waiting


def test_admission_respects_max_num_seqs():
    engine, _, _ = _engine(max_num_seqs=4)
    sink: list = []
    for _ in range(10):
        _add(engine, 10, 50, sink)
    engine.plan_step()
    assert len(engine.running) == 4 and len(engine.waiting) == 6


def test_preemption_by_recompute_when_kv_runs_out():
    engine, clock, _ = _engine(num_gpu_blocks=20, block_size=16, max_num_seqs=8)
    sink: list = []
    for _ in range(4):
        _add(engine, 60, 100, sink)  # 4 blocks each at admission, growing to 10
    _run(engine, clock)
    assert engine.preemptions > 0
    assert sum(n for n, _ in sink) == 400, "preempted requests resume and finish"
    assert engine.used_blocks == 0


def test_stall_makes_no_progress_until_cleared():
    engine, clock, _ = _engine()
    assert clock.now == 0.0
    sink: list = []
    _add(engine, 10, 5, sink)
    engine.faults.set("stall", None, 0.0)
    assert engine.plan_step() is None
    engine.faults.clear("stall")
    _run(engine, clock)
    assert sum(n for n, _ in sink) == 5


def test_kv_leak_grows_with_time_on_the_injected_clock():
    engine, clock, _ = _engine(num_gpu_blocks=1000)
    engine.faults.set("kv_leak", {"blocks_per_s": 100}, 0.0)
    clock.now = 5.0
    assert abs(engine.kv_usage() - 0.5) < 1e-9
    clock.now = 100.0
    assert engine.kv_usage() == 1.0


def test_a_request_never_outgrows_the_pool():
    engine, clock, _ = _engine(num_gpu_blocks=16, block_size=16, max_num_seqs=4)
    sink: list = []
    _add(engine, 200, 10_000, sink)  # would need far more than 16 blocks
    _add(engine, 10, 5, sink)
    _run(engine, clock)
    assert [r for _, r in sink if r] == ["length", "length"]
    assert sum(n for n, _ in sink) == (16 * 16 - 1 - 200) + 5
