"""Drill fleets in worker processes, ``jobs`` at a time.

Each fleet runs in a fresh interpreter (a ``spawn`` process pool with
``max_tasks_per_child=1``): the parent has threads, so fork is unsafe, and nothing of one
fleet (broker, threads, DuckDB, event loops) can leak into the next. Every port a fleet
opens is its own (pods, taps, prober and Alertmanager bind port 0; the embedded broker takes
a free port) and every fleet has its own working directory, so two fleets run side by side.

The longest fleets start first, one per free worker, so the workers finish together; with
a pod budget (``max_pods``) the next fleet to start is the longest that fits beside the
running ones, so the small fleets (a gateway and two pods) run beside a big one; the
outcomes come back in the plans' order whatever the completion order. Two fleets never
start within ``start_gap_s`` of each other, counted from the moment each worker reports its
fleet started (a spawned interpreter takes one to several seconds to get there, more on a
busy machine, so the moment of submission says little). Progress lines are printed by the
workers to stderr, prefixed with the fleet's name (a callable cannot cross processes).

Failure policy: a fleet that raises is reported as a :class:`FleetFailure` naming it, with
the error, and the other fleets go on; a worker that dies (killed, out of memory) breaks the
pool, and every fleet not finished by then is reported failed the same way. A fleet that
overruns its plan by ``watchdog_s`` dumps its threads' stacks to stderr and is stopped (so a
hang costs minutes, not the drill). Ctrl-C (or any error in the parent) stops the workers:
each tears its fleet down, and is killed if that takes over ``STOP_GRACE_S``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import faulthandler
import functools
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from pathlib import Path
from types import FrameType

from llmslo.drill.fleet import FleetPlan, Say, run_fleet
from llmslo.drill.profile import DrillProfile, FleetRun
from llmslo.drill.score import ModeResult

__all__ = [
    "STOP_GRACE_S",
    "DrillInterrupted",
    "FleetFailure",
    "FleetOutcome",
    "FleetStopped",
    "run_plans",
]

#: Seconds a stopped worker gets to tear its fleet down before it is killed.
STOP_GRACE_S = 60.0

FleetResult = tuple[list[ModeResult], FleetRun]
Runner = Callable[[FleetPlan, DrillProfile, Path, "str | None", Say], FleetResult]


@dataclass(frozen=True)
class FleetFailure:
    """A fleet that did not finish: its name, its modes (not drilled), why, and the
    worker's traceback when there is one."""

    name: str
    modes: list[str]
    error: str
    detail: str = field(default="", repr=False)


FleetOutcome = FleetResult | FleetFailure


class FleetStopped(KeyboardInterrupt):
    """Raised in a worker's main thread by SIGTERM/SIGINT or its watchdog: tear the fleet
    down (a ``KeyboardInterrupt``, so no ``except Exception`` on the way swallows it)."""


class DrillInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) in the parent, raised by :func:`run_plans` once the workers are
    stopped, with every fleet's outcome: the finished fleets' results, the others failed
    as interrupted (so a partial report can be written)."""

    def __init__(self, outcomes: list[FleetOutcome]) -> None:
        super().__init__("interrupted")
        self.outcomes = outcomes


def _say(name: str, text: str) -> None:
    print(f"[{name}] {text}", file=sys.stderr, flush=True)


#: Why this worker was stopped, when its watchdog did it (read by the signal handler).
_watchdog_fired: list[str] = []


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    """A second SIGTERM/SIGINT while the fleet is being torn down: nothing more to do."""


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    # Once: a second signal must not interrupt the teardown the first one started. Not
    # SIG_IGN: a Ctrl-C brings SIGINT from the terminal and SIGTERM from the parent at once,
    # and CPython reports a signal already pending when its handler became SIG_IGN
    # ("Signal 15 ignored due to race condition", a traceback mid-teardown).
    signal.signal(signal.SIGTERM, _already_stopping)
    signal.signal(signal.SIGINT, _already_stopping)
    # kafka-python logs its clients' sockets closed under a pending read as ERROR with a
    # traceback: on the way down that is the teardown itself, not news for whoever stopped it.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    raise FleetStopped(
        _watchdog_fired[0] if _watchdog_fired else f"stopped by {signal.Signals(signum).name}"
    )


def _kill_children(pid: int) -> None:
    """SIGKILL the processes ``pid`` started (a fleet's broker, Alertmanager and pipeline),
    and theirs: a worker killed without its teardown would leave them running (the broker
    runs in a session of its own, so no terminal signal reaches it). Linux ``/proc``."""
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children = [int(c) for c in listing.read_text().split()]
        except (OSError, ValueError):  # the task ended meanwhile
            continue
        for child in children:
            _kill_children(child)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def _hard_exit() -> None:
    """The worker did not stop in time: kill what its fleet started, then exit at once."""
    _kill_children(os.getpid())
    os._exit(70)


def _watchdog(name: str, after_s: float) -> threading.Timer:
    """After ``after_s``: dump every thread's stack to stderr and SIGTERM this worker (its
    fleet is torn down); if it still runs ``STOP_GRACE_S`` later, exit at once."""

    def fire() -> None:
        _watchdog_fired.append(f"stopped by its watchdog, still running after {after_s:.0f} s")
        _say(name, f"still running {after_s:.0f} s after start: stopping it; stacks follow")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        hard = threading.Timer(STOP_GRACE_S, _hard_exit)
        hard.daemon = True
        hard.start()
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(after_s, fire)
    timer.daemon = True
    timer.start()
    return timer


#: Where a worker reports ``(fleet name, time.monotonic())`` as its fleet starts; set by the
#: pool's initializer. CLOCK_MONOTONIC is one clock for every process on Linux.
_starts: Queue[tuple[str, float]] | None = None


def _init_worker(starts: Queue[tuple[str, float]]) -> None:
    global _starts
    _starts = starts


def _work(
    runner: Runner,
    plan: FleetPlan,
    profile: DrillProfile,
    workdir: Path,
    alertmanager: str | None,
    progress: bool,
    watchdog_s: float,
    log_level: int = logging.WARNING,
) -> FleetOutcome:
    """One fleet in a worker process; an error comes back as a :class:`FleetFailure`."""
    # A spawned interpreter has no logging set up: the parent's level, lines named by fleet.
    logging.basicConfig(
        level=log_level, format=f"%(asctime)s [{plan.name}] %(levelname)s %(name)s: %(message)s"
    )
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    timer = _watchdog(plan.name, plan.end_s(profile) + watchdog_s)
    say = functools.partial(_say, plan.name) if progress else None
    if _starts is not None:
        _starts.put((plan.name, time.monotonic()))
    try:
        return runner(plan, profile, workdir / plan.name, alertmanager, say)
    except (Exception, FleetStopped) as exc:
        if progress:
            _say(plan.name, f"failed: {type(exc).__name__}: {exc}")
        return _failure(plan, f"{type(exc).__name__}: {exc}", traceback.format_exc())
    finally:
        timer.cancel()


def run_plans(
    plans: list[FleetPlan],
    profile: DrillProfile,
    workdir: Path,
    alertmanager: str | None,
    *,
    jobs: int = 2,
    progress: bool = False,
    say: Say = None,
    runner: Runner = run_fleet,
    watchdog_s: float = 600.0,
    start_gap_s: float = 0.0,
    max_pods: int | None = None,
    on_outcome: Callable[[FleetPlan, FleetOutcome], None] | None = None,
) -> list[FleetOutcome]:
    """Run every plan in its own worker process, ``jobs`` at a time, longest first; returns
    the outcomes in the plans' order. ``max_pods``: the running fleets' pods together stay
    within it (the next fleet that fits starts: small fleets fill in beside a big one; a
    fleet larger than it runs alone); ``None``: ``jobs`` alone bounds them. ``runner`` (a
    module-level function: it is pickled by name) runs one fleet; ``progress``: the workers
    print their progress lines to stderr;
    ``say`` gets the parent's lines (a fleet done, a fleet failed); ``start_gap_s``: the
    least time between two fleets' starts; ``on_outcome(plan, outcome)`` is called as each
    fleet ends (a progress bar).

    Raises ``ValueError`` when ``jobs`` < 1; :class:`DrillInterrupted` on Ctrl-C and any
    other error of the parent, after stopping the workers.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be ≥ 1, not {jobs}")
    outcomes: list[FleetOutcome | None] = [None] * len(plans)
    log_level = logging.getLogger().getEffectiveLevel()
    waiting = collections.deque(sorted(range(len(plans)), key=lambda i: -plans[i].end_s(profile)))
    running: dict[concurrent.futures.Future[FleetOutcome], int] = {}
    submitted: dict[int, float] = {}
    started = time.monotonic()
    context = multiprocessing.get_context("spawn")
    starts: Queue[tuple[str, float]] = context.Queue()
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=min(jobs, max(len(plans), 1)),
        mp_context=context,
        max_tasks_per_child=1,
        initializer=_init_worker,
        initargs=(starts,),
    )
    reported: dict[str, float] = {}  # fleet name → when its worker reported its start
    last: list[tuple[concurrent.futures.Future[FleetOutcome], str]] = []

    def last_start() -> float | None:
        """When the fleet submitted last reported its start (waiting for it), or None when
        there is none, its worker ended before it got there, or it did not get there within
        ``STOP_GRACE_S`` (a worker stuck in its start: not a reason to hold the others)."""
        if not last:
            return None
        future, name = last[0]
        deadline = time.monotonic() + STOP_GRACE_S
        while name not in reported and not future.done() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                reported.update([starts.get(timeout=0.1)])
        return reported.get(name)

    def next_fitting() -> int | None:
        """The longest waiting fleet that a free worker and the pod budget can take."""
        if len(running) >= jobs:
            return None
        if max_pods is None or not running:
            return waiting[0] if waiting else None
        busy = sum(len(plans[i].config.pods) for i in running.values())
        return next((i for i in waiting if busy + len(plans[i].config.pods) <= max_pods), None)

    def start_next(i: int) -> None:
        # One fleet per free worker, no more: a queued call could not be cancelled on Ctrl-C.
        # Never two starts within start_gap_s: fleets of equal length would otherwise start
        # in lockstep, each start's burst of CPU on the other's warm-up.
        if start_gap_s > 0 and (previous := last_start()) is not None:
            time.sleep(max(0.0, previous + start_gap_s - time.monotonic()))
        waiting.remove(i)
        args = (runner, plans[i], profile, workdir, alertmanager, progress, watchdog_s, log_level)
        try:
            future = pool.submit(_work, *args)
        except BrokenProcessPool:
            outcomes[i] = _failure(plans[i], "not started: a worker of the pool ended abruptly")
            return
        running[future] = i
        submitted[i] = time.monotonic()
        last[:] = [(future, plans[i].name)]

    try:
        while (i := next_fitting()) is not None:
            start_next(i)
        while running:
            done, _ = concurrent.futures.wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                outcomes[i] = outcome = _outcome(future, plans[i], watchdog_s)
                if on_outcome is not None:
                    on_outcome(plans[i], outcome)
                if say:
                    worker_s = time.monotonic() - submitted[i]
                    say(_done_line(plans[i].name, outcome, outcomes, started, worker_s))
            while (i := next_fitting()) is not None:  # a broken pool fails every waiting fleet
                start_next(i)
    except KeyboardInterrupt:
        _stop_workers(pool, say)
        raise DrillInterrupted(
            [
                outcome or _failure(plans[i], "interrupted (Ctrl-C) before it finished")
                for i, outcome in enumerate(outcomes)
            ]
        ) from None
    except BaseException:
        _stop_workers(pool, say)
        raise
    finally:
        starts.close()
    pool.shutdown(wait=True)
    return [o for o in outcomes if o is not None]


def _failure(plan: FleetPlan, error: str, detail: str = "") -> FleetFailure:
    return FleetFailure(plan.name, [m.name for m in plan.modes], error, detail)


def _done_line(
    name: str,
    outcome: FleetOutcome,
    outcomes: list[FleetOutcome | None],
    started: float,
    worker_s: float,
) -> str:
    what = (
        f"FAILED: {outcome.error}"
        if isinstance(outcome, FleetFailure)
        else f"done in {outcome[1].wall_s} s ({worker_s:.0f} s with the worker's start)"
    )
    done = sum(o is not None for o in outcomes)
    elapsed = time.monotonic() - started
    return f"[drill] {name} {what} ({done} of {len(outcomes)} fleets, {elapsed:.0f} s)"


def _outcome(
    future: concurrent.futures.Future[FleetOutcome], plan: FleetPlan, watchdog_s: float
) -> FleetOutcome:
    try:
        return future.result()
    except BrokenProcessPool:
        error = (
            "its worker process ended abruptly (killed, out of memory, or not stopping "
            f"{STOP_GRACE_S:.0f} s after its {watchdog_s:.0f}-second watchdog); see stderr"
        )
    except BaseException as exc:  # it did not come back (did not pickle, or was stopped)
        error = f"{type(exc).__name__}: {exc}"
    return _failure(plan, error)


def _stop_workers(pool: concurrent.futures.ProcessPoolExecutor, say: Say) -> None:
    """SIGTERM the running workers (each tears its fleet down), kill the ones still alive
    after ``STOP_GRACE_S``, then shut the pool down (killing the workers it starts meanwhile).

    Not the other way round: on a pool already shut down (``wait=False``), CPython's manager
    thread fails with a ``TypeError`` when it replaces a worker that ended after its one task.
    No call is queued behind the workers (one fleet per free worker), so none is left to
    cancel first."""
    if say and multiprocessing.active_children():
        say(f"[drill] stopping {len(multiprocessing.active_children())} worker(s)")
    deadline = time.monotonic() + STOP_GRACE_S
    # Again until none is left: the pool replaces a worker that ends (an idle one).
    while workers := multiprocessing.active_children():
        for worker in workers:
            if time.monotonic() < deadline:
                worker.terminate()
            elif worker.pid is not None:
                _kill_children(worker.pid)  # its fleet's broker and Alertmanager too
                worker.kill()
        for worker in workers:
            worker.join(max(0.1, min(1.0, deadline + 5 - time.monotonic())))
    # The pool still replaces a worker that ended after its one task, and a replacement may
    # wait for ever on the call queue's lock, which a worker ended above was holding (an idle
    # worker holds it while it waits for a call): the shutdown would join it for ever. So the
    # shutdown runs aside, and any worker alive meanwhile is killed until it has returned.
    shut = threading.Thread(target=pool.shutdown, kwargs={"wait": True, "cancel_futures": True})
    shut.start()
    shut.join(0.5)
    while shut.is_alive():
        for worker in multiprocessing.active_children():
            if worker.pid is not None:
                _kill_children(worker.pid)
            worker.kill()
        shut.join(0.5)
