"""Drill fleets in worker processes (``llmslo.drill.jobs``): order, failures, hangs, Ctrl-C.

The first tests run real spawned worker processes with small runners defined here (they
sleep, raise, die or hang as a fleet could) so the process handling is checked in seconds;
the last ones run real fleets two at a time (~1.5 minutes).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from llmslo.drill.fleet import FleetPlan, Say
from llmslo.drill.jobs import DrillInterrupted, FleetFailure, run_plans
from llmslo.drill.matrix import MAX_PODS, DrillProfile, run_drill
from llmslo.drill.modes import MODES, DrillMode
from llmslo.drill.profile import FleetRun, fleet_rng, injection_times
from llmslo.drill.report import render_markdown
from llmslo.drill.score import ModeResult
from simulator import FleetConfig, NodeConfig, PodConfig

PROFILE = DrillProfile()
CONFIG = FleetConfig(
    nodes=[NodeConfig(name="n", gpus=1)],
    pods=[PodConfig(name="p0", dialect="vllm", node="n", gpus=[0])],
)


def _plan(name: str, seconds: float, pods: int = 1) -> FleetPlan:
    """A fault-free plan of ``pods`` pods that runs ``seconds`` (the runners below sleep
    that long)."""
    config = CONFIG.model_copy(
        update={
            "pods": [
                PodConfig(name=f"p{i}", dialect="vllm", node="n", gpus=[0]) for i in range(pods)
            ]
        }
    )
    return FleetPlan(name, (), config, (), 1.0, 1.0, healthy_minutes=seconds / 60)


def _sleeping_runner(
    plan: FleetPlan, profile: DrillProfile, workdir: Path, alertmanager: str | None, say: Say
) -> tuple[list[ModeResult], FleetRun]:
    """Sleeps as long as its plan runs; notes its process id and start time; a plan named
    ``broken*`` raises at start, one named ``dies*`` ends its process, ``hangs*`` never
    returns (and notes when it is torn down)."""
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    (workdir / "pid").write_text(f"{os.getpid()} {started} {time.monotonic()}")
    if plan.name.startswith("broken"):
        raise ValueError("the simulated fleet would not start")
    if plan.name.startswith("dies"):
        os._exit(3)
    try:
        time.sleep(600 if plan.name.startswith("hangs") else plan.end_s(profile))
    finally:
        (workdir / "torn-down").write_text("yes")
    return [], FleetRun(plan.name, [], [], 0, started_ts_ms=int(started * 1000), wall_s=0.1)


def _ran(workdir: Path, name: str) -> tuple[int, float]:
    """The process id that ran fleet ``name`` and when it started (``time.monotonic()``)."""
    pid, _, started = (workdir / name / "pid").read_text().split()
    return int(pid), float(started)


def test_outcomes_come_back_in_plan_order_longest_fleet_first_each_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    plans = [_plan("short", 0.2), _plan("long", 1.5), _plan("middle", 0.8)]
    outcomes = run_plans(plans, PROFILE, tmp_path, None, jobs=1, runner=_sleeping_runner)
    assert [o[1].name for o in outcomes if not isinstance(o, FleetFailure)] == [
        "short",
        "long",
        "middle",
    ]
    ran = {p.name: _ran(tmp_path, p.name) for p in plans}
    assert sorted(ran, key=lambda n: ran[n][1]) == ["long", "middle", "short"]
    # One at a time: each fleet starts once the one before has run its length.
    assert ran["middle"][1] - ran["long"][1] >= 1.5
    assert ran["short"][1] - ran["middle"][1] >= 0.8
    pids = {pid for pid, _ in ran.values()}
    assert len(pids) == 3 and os.getpid() not in pids  # a fresh interpreter per fleet


def test_two_fleets_never_start_within_the_start_gap(tmp_path: Path) -> None:
    plans = [_plan("a", 0.5), _plan("b", 0.5), _plan("c", 0.5)]
    run_plans(plans, PROFILE, tmp_path, None, jobs=2, runner=_sleeping_runner, start_gap_s=2.0)
    starts = sorted(_ran(tmp_path, p.name)[1] for p in plans)
    # The gap is counted from each fleet's real start in its worker, so a spawned
    # interpreter that is slow to come up (a busy machine) does not eat into it; the margin
    # is the time between a worker's report and its runner's first line.
    assert all(later - earlier >= 1.9 for earlier, later in itertools.pairwise(starts))


def test_the_pod_budget_runs_small_fleets_beside_a_big_one_never_two_big_ones(
    tmp_path: Path,
) -> None:
    plans = [_plan("big-a", 4.0, pods=3), _plan("big-b", 3.5, pods=3), _plan("small", 0.5)]
    run_plans(plans, PROFILE, tmp_path, None, jobs=3, max_pods=4, runner=_sleeping_runner)
    start = {p.name: _ran(tmp_path, p.name)[1] for p in plans}
    # big-b (3 pods) does not fit beside big-a (3 of 4): the 1-pod fleet starts instead,
    # before big-a ends, and big-b only once big-a has run its length.
    assert start["small"] < start["big-a"] + 4.0
    assert start["big-b"] >= start["big-a"] + 4.0
    # Without the budget the three free workers take all three at once.
    run_plans(plans, PROFILE, tmp_path / "free", None, jobs=3, runner=_sleeping_runner)
    free = {p.name: _ran(tmp_path / "free", p.name)[1] for p in plans}
    assert free["big-b"] < free["big-a"] + 4.0


def test_a_fleet_that_raises_is_reported_by_name_and_the_others_still_finish(
    tmp_path: Path,
) -> None:
    plans = [_plan("first", 0.5), _plan("broken", 0.5), _plan("last", 0.5)]
    first, broken, last = run_plans(plans, PROFILE, tmp_path, None, runner=_sleeping_runner)
    assert isinstance(broken, FleetFailure) and broken.name == "broken"
    assert broken.error == "ValueError: the simulated fleet would not start"
    assert "_sleeping_runner" in broken.detail  # the worker's traceback
    assert not isinstance(first, FleetFailure) and first[1].name == "first"
    assert not isinstance(last, FleetFailure) and last[1].name == "last"


def test_a_worker_that_dies_is_reported_by_name_and_so_is_every_fleet_after_it(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    plans = [_plan("dies", 1.0), _plan("next", 0.5), _plan("last", 0.2)]  # in this order
    dies, *after = run_plans(plans, PROFILE, tmp_path, None, jobs=1, runner=_sleeping_runner)
    assert isinstance(dies, FleetFailure) and dies.name == "dies"
    assert "ended abruptly" in dies.error
    # The dead worker broke the pool: the fleets waiting for it are named, not lost.
    assert [(f.name, f.error) for f in after if isinstance(f, FleetFailure)] == [
        ("next", "not started: a worker of the pool ended abruptly"),
        ("last", "not started: a worker of the pool ended abruptly"),
    ]
    assert time.monotonic() - started < 60


def test_a_hung_fleet_is_stopped_by_its_watchdog_and_torn_down(tmp_path: Path) -> None:
    started = time.monotonic()
    [outcome] = run_plans(
        [_plan("hangs", 0)], PROFILE, tmp_path, None, runner=_sleeping_runner, watchdog_s=3
    )
    assert isinstance(outcome, FleetFailure) and outcome.name == "hangs"
    assert "watchdog" in outcome.error
    assert (tmp_path / "hangs" / "torn-down").exists()
    assert time.monotonic() - started < 60


PARENT = """
import sys
from pathlib import Path
from llmslo.drill.matrix import DrillProfile
from llmslo.drill.jobs import run_plans
from tests.llmslo.test_drill_jobs import _plan, _sleeping_runner
run_plans([_plan("hangs-a", 0), _plan("hangs-b", 0), _plan("waits", 0)], DrillProfile(),
          Path(sys.argv[1]), None, jobs=2, runner=_sleeping_runner)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_ctrl_c_stops_the_workers_and_each_tears_its_fleet_down(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 60
        pid_files = [tmp_path / name / "pid" for name in ("hangs-a", "hangs-b")]
        while not all(f.exists() for f in pid_files) and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = [_ran(tmp_path, name)[0] for name in ("hangs-a", "hangs-b")]
        parent.send_signal(signal.SIGINT)  # the parent only, as `kill -INT` would
        assert parent.wait(timeout=60) != 0
    finally:
        if parent.poll() is None:
            parent.kill()
    for name in ("hangs-a", "hangs-b"):
        assert (tmp_path / name / "torn-down").exists()
    assert not any(_alive(pid) for pid in workers)
    assert not (tmp_path / "waits").exists()  # never started


@pytest.mark.slow
def test_a_real_fleet_that_fails_in_its_worker_is_named_in_the_report(tmp_path: Path) -> None:
    # Its load options are refused when the edges start, after broker, fleet and pipeline.
    bad = DrillMode("stall_bad_load", "stall", frozenset({"stall"}), load={"no_such": 1})
    started = time.monotonic()
    report = run_drill([bad], tmp_path, DrillProfile(), healthy_control=False)
    [failure] = report.failed
    assert failure.name == "fleet0" and failure.modes == ["stall_bad_load"]
    assert (
        failure.error.startswith("ConfigError: drill mode options") and "no_such" in failure.error
    )
    assert report.results == [] and report.fleets == []
    text = render_markdown(report)
    assert "## Failed fleets" in text and "- fleet0 (stall_bad_load): ConfigError" in text
    assert time.monotonic() - started < 120  # refused at start, not after the fleet's 2 minutes


@pytest.mark.slow
def test_two_fleets_at_once_inject_at_their_planned_offsets_and_keep_their_stores_apart(
    tmp_path: Path,
) -> None:
    profile = DrillProfile(
        warmup_s=10,
        jitter_s=5,
        hold_s=20,
        clear_s=10,
        modes_per_fleet=1,
        healthy_pods=1,
        seed=5,
        start_gap_s=5,
    )
    modes = [MODES["stall"], MODES["crash"]]
    two = run_drill(modes, tmp_path / "two", profile, healthy_control=False, jobs=2)
    assert not two.failed and two.jobs == 2
    assert [(r.mode, r.fleet) for r in two.results] == [("stall", "fleet0"), ("crash", "fleet1")]
    assert [(f.name, f.modes) for f in two.fleets] == [("fleet0", ["stall"]), ("fleet1", ["crash"])]
    assert two.wall_s is not None and all(f.wall_s for f in two.fleets)
    # Each fleet's moments come from its own rng (seed, fleet index), whatever ran beside it
    # or before it, so two at a time inject where one at a time would.
    planned = [
        injection_times([mode], profile, fleet_rng(profile.seed, index))
        for index, mode in enumerate(modes)
    ]
    assert [f.inject_s for f in two.fleets] == planned
    assert planned[0] != planned[1]  # one rng per fleet, not a copy
    # Each fault went in at its planned offset from its fleet's start.
    for result, fleet in zip(two.results, two.fleets, strict=True):
        offset_s = (result.injected_ts_ms - fleet.started_ts_ms) / 1000
        assert abs(offset_s - fleet.inject_s[0]) < 2.0
    text = render_markdown(two)
    assert (
        f"2 fleets, 2 at a time within {MAX_PODS} pods (a worker process each, longest first "
        f"that fits); drill wall time {two.wall_s:.1f} s, the mode fleets done at "
        f"{two.modes_wall_s:.1f} s" in text
    )
    # Side by side, nothing crossed: each fleet's store holds its own pods' samples only.
    for fleet in two.fleets:
        own = set(fleet.healthy_instances) | {
            r.instance for r in two.results if r.fleet == fleet.name
        }
        with duckdb.connect(
            str(tmp_path / "two" / fleet.name / "drill.duckdb"), read_only=True
        ) as con:
            stored = {
                i for (i,) in con.execute("SELECT DISTINCT instance FROM engine_samples").fetchall()
            }
        assert stored and stored <= own, (fleet.name, stored, own)
    # Two at a time they overlap.
    a, b = sorted(two.fleets, key=lambda f: f.started_ts_ms)
    assert b.started_ts_ms < a.started_ts_ms + a.minutes * 60_000


def test_ctrl_c_keeps_the_outcomes_of_the_fleets_that_finished(tmp_path: Path) -> None:
    plans = [_plan("quick", 0.2), _plan("hangs", 1.0)]
    ended: list[str] = []

    def on_outcome(plan: FleetPlan, outcome: object) -> None:
        ended.append(plan.name)
        # Ctrl-C once the quick fleet is in: the main thread gets KeyboardInterrupt.
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()

    with pytest.raises(DrillInterrupted) as stopped:
        run_plans(
            plans, PROFILE, tmp_path, None, jobs=2, runner=_sleeping_runner, on_outcome=on_outcome
        )
    quick, hung = stopped.value.outcomes
    assert ended == ["quick"]
    assert not isinstance(quick, FleetFailure) and quick[1].name == "quick"
    assert isinstance(hung, FleetFailure) and "interrupted" in hung.error
    assert (tmp_path / "hangs" / "torn-down").exists()  # its worker tore the fleet down


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_llmslo_drill_and_its_fleet(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    argv = ["--modes", "stall", "--healthy-minutes", "0", "--workdir", str(tmp_path)]
    command = subprocess.Popen(
        [sys.executable, "-m", "llmslo", "drill", *argv, "-o", str(tmp_path / "report.md")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert command.stderr is not None
        for line in command.stderr:  # the worker says so once its fleet is up
            if line.startswith("[fleet0]") and "pods" in line:
                break
        os.killpg(command.pid, signal.SIGINT)  # Ctrl-C: every process of the group
        assert command.wait(timeout=90) == 130
        err = command.stderr.read()
        assert "interrupted" in err
        assert "Task was destroyed but it is pending" not in err
        assert "Traceback" not in err  # e.g. the pool's manager thread failing on its way down
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
    # Nothing of the fleet is left running: the group (workers, Alertmanager) is empty...
    deadline = time.monotonic() + 10
    while _group_alive(command.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_alive(command.pid)
    # ... and nothing else runs with the drill's workdir in its command line.
    left = [
        p
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and str(tmp_path) in _cmdline(p) and int(p.name) != command.pid
    ]
    assert left == []
    # The partial report: the interrupted fleet is listed, not silently dropped.
    report = (tmp_path / "report.md").read_text()
    assert "Interrupted (Ctrl-C)" in report and "fleet0 (stall)" in report


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
