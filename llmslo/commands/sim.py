"""The simulator's subcommands: ``sim`` (+ ``sim history``) and ``load``."""

from __future__ import annotations

import argparse
import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmslo.options import (
    add_common_options,
    add_subcommand,
    install_stop_handlers,
    print_json,
    resolve_config,
)
from llmslo.progress import add_quiet_option, progress
from llmslo.run import load_model
from pipeline.bus import Bus
from pipeline.errors import ConfigError
from pipeline.processes import freeze_startup_heap
from pipeline.publisher import Publisher
from pipeline.schema import ENGINE_SAMPLES
from pipeline.store import Store
from simulator.config import (
    DIALECTS,
    EngineConfig,
    FleetConfig,
    load_fleet_config,
    simple_fleet,
)
from simulator.fleet import Fleet
from simulator.history import BusSink, HistoryConfig, HistoryGenerator, HistorySink, StoreSink
from simulator.load import LoadConfig, run_load_sync
from simulator.scenario import ScenarioRunner, load_scenario
from simulator.traces import load_trace, poisson_arrivals
from slo.jobs import JobsConfig
from slo.replay import ReplaySummary, replay, replay_steps
from slo.rollups.requests import rollup_history
from slo.windows import parse_duration_ms

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add ``sim`` (with ``sim history``) and ``load``."""
    sim = add_subcommand(
        subparsers,
        "sim",
        "Run a simulated fleet (engine pods + dcgm exporters) until SIGTERM.",
        "llmslo sim --pods 8 --dialects vllm,sglang,trtllm,vllm-legacy\n"
        "llmslo sim --pods 8 --load-rate 20        # with background Poisson load\n"
        "llmslo sim --pods 4 --gateway --router-down-policy fail_close   # + gateway/router\n"
        "llmslo probe --url GATEWAY_URL --instance gateway --bootstrap-servers ...  # probe it\n"
        "llmslo sim --pods 4 --gateway prefix_locality --prefix-cache 64 --autoscaler\n"
        "llmslo sim --pods 4 --gateway --autoscaler --pd pod-2,pod-3  # gateway over pod-0,1\n"
        "llmslo sim --pods 2 --pd pod-0,pod-1      # a prefill/decode pair over two pods\n"
        "llmslo sim --config config/simulator.example.yaml \\\n"
        "    --scenario config/simulator.scenario.example.yaml\n"
        "llmslo sim history --days 30 --pods 16 --db var/llmslo.duckdb",
    )
    sim.add_argument(
        "-c",
        "--config",
        type=Path,
        help="fleet YAML (FleetConfig, or an llmslo config with a simulator: section)",
    )
    sim.add_argument("--pods", type=int, default=4, help="pods when no --config (default 4)")
    sim.add_argument(
        "--dialects",
        default="vllm",
        help=f"comma list, round-robin over pods ({','.join(DIALECTS)})",
    )
    sim.add_argument("--model", default="llama-3-8b", help="served model name (default llama-3-8b)")
    sim.add_argument(
        "--speed", type=float, default=1.0, help="service times divided by this (default 1)"
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--prefill-chunk-tokens",
        type=int,
        help="engines' chunked-prefill token budget per step, for every pod (with --config: "
        "overrides each pod's engine setting; default 512 or what the file says; smaller "
        "steps keep ITL jitter down, as vLLM's max_num_batched_tokens)",
    )
    sim.add_argument("--scenario", type=Path, help="fault timeline YAML to play")
    sim.add_argument("--seconds", type=float, help="stop after this long (default: until SIGTERM)")
    sim.add_argument(
        "--load-rate",
        type=float,
        default=0.0,
        help="also drive Poisson load at the fleet, requests/s in total (default none)",
    )
    sim.add_argument(
        "--load-output-tokens",
        type=int,
        default=128,
        help="mean output tokens of that load (default 128)",
    )
    _add_front_end_options(sim)
    sim.set_defaults(handler=run_sim)
    sim_sub = sim.add_subparsers(dest="sim_command", required=False, metavar="SUBCOMMAND")
    history = sim_sub.add_parser(
        "history",
        help="write N days of synthetic engine/GPU/request rows (DuckDB or Kafka)",
        description="Generate history with simulated timestamps ending now.",
        epilog="examples:\n  llmslo sim history --days 30 --db var/llmslo.duckdb\n"
        "  llmslo sim history --days 1 --bootstrap-servers embedded",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_options(history, bus=True, db=True)
    history.add_argument("--days", type=float, required=True, help="days of history")
    history.add_argument("--pods", type=int, default=8, help="simulated pods (default 8)")
    history.add_argument(
        "--interval", type=int, default=60, help="scrape interval, seconds (default 60)"
    )
    history.add_argument("--model", default="llama-3-8b")
    history.add_argument(
        "--peak-rps", type=float, default=4.0, help="peak requests/s per pod (default 4)"
    )
    history.add_argument("--incidents-per-day", type=float, default=1.0)
    history.add_argument("--end-ts-ms", type=int, help="last simulated timestamp (default now)")
    history.add_argument("--seed", type=int, default=0)
    add_quiet_option(history)
    history.add_argument(
        "--no-replay",
        action="store_true",
        help="skip the SLO replay at the end (by default the SLO jobs' cycle runs at every "
        "minute of the newest --replay-last of the history, with slo.spec or the example "
        "spec, so the file opens with findings, flags and SLO status; llmslo jobs --replay "
        "does it later, over any range)",
    )
    history.add_argument(
        "--replay-last",
        default="1d",
        metavar="DURATION",
        help="how much of the history's end to replay (default 1d, about 1,440 cycles; "
        "'all' for the whole history, which takes as many cycles as minutes)",
    )
    history.set_defaults(handler=run_history)

    load = add_subcommand(
        subparsers,
        "load",
        "Drive load at pods: Poisson or trace replay; prints a client-side report.",
        "llmslo load --targets http://127.0.0.1:8000 --rate 20 --duration 60\n"
        "llmslo load --targets http://127.0.0.1:8000,http://127.0.0.1:8001 \\\n"
        "    --trace ../shared/traces/azure2023_AzureLLMInferenceTrace_conv.csv \\\n"
        "    --time-scale 10 --limit 500\n"
        "llmslo load --targets URL --rate 50 --duration 30 --retries 3 --deadline 5 \\\n"
        "    --cancel-after 2 --hot-share 0.5",
    )
    load.add_argument("--targets", required=True, help="comma-separated base URLs")
    load.add_argument("--model", default="llama-3-8b")
    load.add_argument("--rate", type=float, help="Poisson arrivals per second (when no --trace)")
    load.add_argument("--duration", type=float, default=30.0, help="Poisson duration, seconds")
    load.add_argument("--trace", type=Path, help="Azure CSV or Mooncake JSONL trace")
    load.add_argument("--limit", type=int, help="first N trace requests")
    load.add_argument("--time-scale", type=float, default=1.0, help="replay speed-up (default 1)")
    load.add_argument("--concurrency", type=int, default=256)
    load.add_argument("--cancel-after", type=float, help="client cancels after N s")
    load.add_argument("--deadline", type=float, help="client deadline, seconds")
    load.add_argument(
        "--retries", type=int, default=0, help="extra attempts before the first token"
    )
    load.add_argument(
        "--hot-share", type=float, default=0.0, help="extra share routed to the first target"
    )
    load.add_argument("--max-output-tokens", type=int)
    load.add_argument("--max-prompt-tokens", type=int)
    load.add_argument(
        "--completions", action="store_true", help="use /v1/completions instead of chat"
    )
    load.add_argument("--no-stream", action="store_true")
    load.add_argument(
        "--slo-ttft-ms",
        type=float,
        help="every request's own TTFT target, sent as x-llm-d-slo-ttft-ms",
    )
    load.add_argument(
        "--slo-tpot-ms",
        type=float,
        help="every request's own TPOT target, sent as x-llm-d-slo-tpot-ms",
    )
    load.set_defaults(handler=run_load_cmd)


def _add_front_end_options(sim: argparse.ArgumentParser) -> None:
    """Flags for what stands in front of the pods (``gateway:`` and ``pd:`` in --config);
    they combine, and override what the config says."""
    sim.add_argument(
        "--gateway",
        nargs="?",
        const="round_robin",
        choices=["round_robin", "least_in_flight", "prefix_locality"],
        metavar="POLICY",
        help="start a gateway + router in front of the pods (policy round_robin, "
        "least_in_flight or prefix_locality; default round_robin, or least_in_flight when "
        "only --autoscaler asks for the gateway); its URL is printed under 'gateway'",
    )
    sim.add_argument(
        "--router-down-policy",
        choices=("fail_open", "fail_close", "reject"),
        help="the gateway's answer while its router is down (default fail_close; implies --gateway)",
    )
    sim.add_argument(
        "--autoscaler",
        action="store_true",
        help="scale the gateway's pods (implies --gateway; kube-state-metrics names on its "
        "own /metrics)",
    )
    sim.add_argument(
        "--pd",
        metavar="PREFILL,DECODE",
        help="a prefill/decode pair over these two pods (the gateway then fronts the others)",
    )
    sim.add_argument(
        "--prefix-cache",
        type=int,
        metavar="N",
        help="every pod caches N prompt prefixes (LRU) instead of one shared system prompt "
        "(with --config: overrides each pod's engine setting)",
    )


def _front_end_config(args: argparse.Namespace, config: FleetConfig) -> dict[str, Any]:
    """``gateway:`` and ``pd:`` of ``config`` with the flags applied on top."""
    front: dict[str, Any] = {
        "gateway": config.gateway.model_dump(exclude_unset=True) if config.gateway else None,
        "pd": config.pd.model_dump(exclude_unset=True) if config.pd else None,
    }
    if args.gateway or args.router_down_policy or args.autoscaler:
        gateway = front["gateway"] or {}
        if args.gateway:
            gateway["policy"] = args.gateway
        elif "policy" not in gateway and args.autoscaler:
            gateway["policy"] = "least_in_flight"  # spreads by load, which is what it scales on
        if args.router_down_policy:
            gateway["router_down_policy"] = args.router_down_policy
        if args.autoscaler:
            gateway.setdefault("autoscaler", {})
        front["gateway"] = gateway
    if args.pd:
        names = [n.strip() for n in args.pd.split(",")]
        if len(names) != 2:
            raise ConfigError("--pd: give two pod names, PREFILL,DECODE")
        front["pd"] = {"prefill": names[0], "decode": names[1]}
    return front


def _engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Engine settings the flags give (only those given), checked so an error names the flag.

    Raises :class:`ConfigError` naming the flag when a value is out of range.
    """
    engine: dict[str, Any] = {}
    if args.prefill_chunk_tokens is not None:
        engine["prefill_chunk_tokens"] = args.prefill_chunk_tokens
    if args.prefix_cache is not None:
        engine["prefix_cache_prefixes"] = args.prefix_cache
    try:
        EngineConfig.model_validate(engine)
    except ValidationError as exc:
        error = exc.errors()[0]
        flag = "--prefix-cache" if "prefix" in str(error["loc"]) else "--prefill-chunk-tokens"
        raise ConfigError(f"{flag}: {error['msg']}") from exc
    return engine


def _fleet_config(args: argparse.Namespace) -> FleetConfig:
    """The fleet of ``--config`` (or of ``--pods``/``--dialects``) with the flags on top:
    engine flags override every pod's engine, front-end flags the ``gateway:``/``pd:`` keys."""
    engine = _engine_overrides(args)
    if args.config:
        config = load_fleet_config(args.config)
    else:
        config = simple_fleet(
            args.pods,
            [d.strip() for d in args.dialects.split(",") if d.strip()],
            model=args.model,
            speed=args.speed,
            seed=args.seed,
            engine=EngineConfig.model_validate(engine),
        )
    overrides_engines = bool(engine and args.config)
    front_end_flags = args.gateway or args.router_down_policy or args.autoscaler or args.pd
    if not (overrides_engines or front_end_flags):
        return config
    data = config.model_dump()
    if overrides_engines:
        for pod in data["pods"]:
            pod["engine"] = {**pod["engine"], **engine}
    # validated again as a whole: pod names in gateway.pods / pd must exist
    return load_fleet_config({**data, **_front_end_config(args, config)})


def run_sim(args: argparse.Namespace) -> int:
    if getattr(args, "sim_command", None) == "history":
        return run_history(args)
    config = _fleet_config(args)
    scenario = (
        load_scenario(args.scenario, [p.name for p in config.pods]) if args.scenario else None
    )
    stopped = threading.Event()
    install_stop_handlers(stopped.set)
    with Fleet(config) as fleet:
        freeze_startup_heap()  # the pods' token timing must not carry full-collection pauses
        print_json(fleet.describe())
        runner = ScenarioRunner(fleet, scenario).start() if scenario else None
        loaders = _start_background_load(fleet, args, stopped) if args.load_rate > 0 else []
        deadline = time.monotonic() + args.seconds if args.seconds else None
        while not stopped.wait(0.2):
            if deadline is not None and time.monotonic() >= deadline:
                break
        stopped.set()
        for loader in loaders:
            loader.join(timeout=60)
        if runner is not None:
            runner.stop()
    return 0


def _start_background_load(
    fleet: Fleet, args: argparse.Namespace, stop: threading.Event
) -> list[threading.Thread]:
    """Poisson load at every pod, one client thread per served model, rate split by pod count."""
    by_model: dict[str, list[str]] = {}
    for pod in fleet.pods:
        by_model.setdefault(pod.model, []).append(pod.url)
    threads = []
    for i, (model, urls) in enumerate(sorted(by_model.items())):
        rate = args.load_rate * len(urls) / len(fleet.pods)
        config = LoadConfig(targets=urls, model=model, max_prompt_tokens=8192, seed=args.seed + i)
        arrivals = poisson_arrivals(
            rate, math.inf, seed=args.seed + i, mean_output_tokens=args.load_output_tokens
        )
        thread = threading.Thread(
            target=run_load_sync,
            args=(config, arrivals),
            kwargs={"stop": stop, "keep_results": False},
            name=f"load-{model}",
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    return threads


def run_history(args: argparse.Namespace) -> int:
    end = args.end_ts_ms if args.end_ts_ms is not None else int(time.time() * 1000)
    if args.days <= 0 or args.pods < 1 or args.interval < 1:
        raise ConfigError("--days, --pods and --interval must be positive")
    generator = HistoryGenerator(
        HistoryConfig(
            days=args.days,
            end_ts_ms=end,
            pods=args.pods,
            interval_s=args.interval,
            model=args.model,
            peak_req_per_s=args.peak_rps,
            incidents_per_day=args.incidents_per_day,
            seed=args.seed,
        )
    )
    replay_from = None if args.replay_last == "all" else end - _duration(args.replay_last)
    config = resolve_config(args)
    rows: dict[str, int] = {}
    replayed: ReplaySummary | None = None  # the jobs replay only what they can read: DuckDB
    if args.bootstrap_servers:
        with Bus(config.bus) as bus:
            bus.ensure_topics()
            # A history is bigger than any live buffer: BusSink waits for each chunk's acks.
            publisher = Publisher(
                bus.producer, component="sim-history", max_rows=_HISTORY_BUFFER_ROWS
            )
            try:
                _drain(generator, BusSink(publisher), rows, quiet=args.quiet)
            finally:
                publisher.close()
        target = f"kafka {config.bus.bootstrap_servers}"
    else:
        with Store(config.store.path) as store:
            _drain(generator, StoreSink(store), rows, quiet=args.quiet)
            # Nothing more arrives for these minutes: the dashboards' long ranges read these.
            rollup_history(store.con)
            if not args.no_replay:
                jobs_config = config.section("slo", JobsConfig)
                model = load_model(jobs_config.spec)
                steps = replay_steps(store.con, start_ms=replay_from)
                with progress("replay", len(steps), "steps", quiet=args.quiet) as advance:
                    replayed = replay(
                        store.con,
                        model,
                        jobs_config,
                        start_ms=replay_from,
                        on_step=lambda _: advance(1),
                    )
        target = str(config.store.path)
    print_json(
        {
            "history": target,
            "days": args.days,
            "pods": args.pods,
            "rows": rows,
            "incidents_ts_ms": generator.incidents,
            "replay": None if replayed is None else replayed.as_dict(),
        }
    )
    return 0


def _duration(text: str) -> int:
    try:
        return parse_duration_ms(text)
    except ValueError as exc:
        raise ConfigError(f"--replay-last: {exc} (or all)") from None


#: Rows the history publisher may hold: more than one generated hour of the largest fleet.
_HISTORY_BUFFER_ROWS = 10_000_000


def _drain(
    generator: HistoryGenerator, sink: HistorySink, rows: dict[str, int], *, quiet: bool
) -> None:
    """Write every generated chunk to ``sink``, counting rows per table, with a bar of
    simulated hours (one engine chunk per hour)."""
    with progress("history", generator.hours, "sim h", quiet=quiet) as advance:
        for schema, table in generator.chunks():
            sink.write(schema, table)
            rows[schema.table] = rows.get(schema.table, 0) + table.num_rows
            if schema is ENGINE_SAMPLES:
                advance(1)


def run_load_cmd(args: argparse.Namespace) -> int:
    targets = [t.strip().rstrip("/") for t in args.targets.split(",") if t.strip()]
    config = LoadConfig(
        targets=targets,
        model=args.model,
        chat=not args.completions,
        stream=not args.no_stream,
        time_scale=args.time_scale,
        concurrency=args.concurrency,
        cancel_after_s=args.cancel_after,
        deadline_s=args.deadline,
        max_attempts=1 + max(0, args.retries),
        hot_share=args.hot_share,
        max_output_tokens=args.max_output_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
    )
    if args.trace:
        requests = load_trace(args.trace)[: args.limit] if args.limit else load_trace(args.trace)
    elif args.rate:
        requests = list(poisson_arrivals(args.rate, args.duration))
    else:
        raise ConfigError("give --rate (Poisson) or --trace FILE")
    report = run_load_sync(config, requests)
    print_json(json.loads(json.dumps(report.summary(), default=float)))
    return 0
