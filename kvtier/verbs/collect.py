"""`kvtier collect`: the collector service, or the monitoring files for an existing stack."""

SUMMARY = ("run the collector: event taps and metric scrapers, ingest into DuckDB, Prometheus "
           "/metrics, OTLP, Parquet segments")
EXAMPLE = ("kvtier collect --store kvtier-out/kvtier.duckdb --hooks tcp://127.0.0.1:5570 "
           "--vllm-events tcp://127.0.0.1:5557 --metrics-port 9400 --segments kvtier-out/segments")
DEFAULT_HOOKS = "tcp://127.0.0.1:5570"


def add_arguments(parser) -> None:
    parser.add_argument("--store", default="kvtier-out/kvtier.duckdb", help="DuckDB store file (created if new)")
    parser.add_argument("--segments", help="write Parquet segments here (what the dashboard reads)")
    parser.add_argument("--export-every-s", type=float, default=60.0, help="segment export period")
    parser.add_argument("--retention", help="delete records older than this (e.g. 7d, 12h)")
    parser.add_argument("--hooks", action="append", nargs="?", const=DEFAULT_HOOKS, default=[],
                        metavar="ENDPOINT",
                        help="bind this ZMQ endpoint for the batches kvtier's in-engine plug-ins ship "
                             f"(repeatable; --hooks alone: {DEFAULT_HOOKS}, loopback)")
    parser.add_argument("--vllm-events", action="append", default=[], metavar="ENDPOINT",
                        help="bind this ZMQ endpoint for vLLM's KV-event publisher (repeatable)")
    parser.add_argument("--vllm-replay", action="append", default=[], metavar="ENDPOINT",
                        help="vLLM's replay endpoint (its --kv-events-config replay_endpoint), the "
                             "Nth for data-parallel rank N-1: gaps, also those a collector restart "
                             "leaves, are asked of it (repeatable)")
    parser.add_argument("--sglang-events", action="append", default=[], metavar="ENDPOINT",
                        help="bind this ZMQ endpoint for SGLang's KV-event publisher (its "
                             "--kv-events-config; the same wire format as vLLM's; repeatable)")
    parser.add_argument("--dynamo-events", action="append", default=[], metavar="ENDPOINT",
                        help="connect to a Dynamo worker's ZMQ KV-event publisher (it binds its "
                             "--zmq-kv-events-ports; the vLLM wire format), e.g. "
                             "tcp://127.0.0.1:5557 (repeatable)")
    parser.add_argument("--vllm-connect", action="store_true",
                        help="connect to the --vllm-events and --sglang-events endpoints instead of "
                             "binding (for a publisher that binds: an endpoint such as tcp://*:5557)")
    parser.add_argument("--trtllm-events", action="append", default=[], metavar="URL",
                        help="poll TensorRT-LLM's /kv_cache_events at this URL (repeatable)")
    parser.add_argument("--scrape", action="append", default=[], metavar="URL[=PROFILE]",
                        help="scrape this Prometheus /metrics page and store each interval's "
                             f"series; PROFILE is one of {', '.join(_profiles())} (default: "
                             "guessed from the series names) (repeatable)")
    parser.add_argument("--scrape-instance", metavar="NAME",
                        help="the instance the --scrape pages serve (default: --instance); name "
                             "the engine's kvtier_instance so its hooks and its /metrics are "
                             "cross-checked (kvtier_crosscheck_difference)")
    parser.add_argument("--scrape-interval-s", type=float, default=10.0,
                        help="seconds between scrapes of each --scrape page (at least 0.1)")
    parser.add_argument("--instance", help="name of the serving instance (default: host name)")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="address for /metrics and /healthz (default loopback)")
    parser.add_argument("--metrics-port", type=int, default=9400,
                        help="port for /metrics and /healthz (0: any free port)")
    parser.add_argument("--otlp", action="store_true",
                        help="export metrics and request spans over OTLP/HTTP (OTEL_EXPORTER_OTLP_* variables)")
    parser.add_argument("--recommendation", metavar="FILE",
                        help="recommendation.json to export as kvtier_recommendation_info (re-read when it "
                             "changes); its promises are checked as recommend --check does, live, and "
                             "its rollback rule sets the guardrail's budget")
    parser.add_argument("--duration-s", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    parser.add_argument("--stop-grace-s", type=float, default=30.0,
                        help="on a stop (Ctrl-C, SIGTERM, SIGHUP), store what already reached the "
                             "collector for at most this long; what is left is counted (default 30)")
    parser.add_argument("--emit-monitoring", metavar="DIR",
                        help="write the Grafana dashboard and Prometheus alert rules to DIR and exit")
    parser.add_argument("--ttft-p99-budget-s", type=float,
                        help="rollback rule: p99 TTFT budget (default: the --recommendation's, else 2)")
    parser.add_argument("--itl-p99-budget-s", type=float,
                        help="rollback rule: p99 ITL budget (default: the --recommendation's, else 0.1)")
    parser.add_argument("--sustained-s", type=int,
                        help="rollback rule: how long a breach must last (default: the "
                             "--recommendation's, else 300)")
    from kvtier.verbs.collect_guardrail import add_guardrail_arguments

    add_guardrail_arguments(parser)  # --guardrail; --window-s
    from kvtier.verbs.collect_curves import add_curve_arguments

    add_curve_arguments(parser)  # --live-curves; the headroom keeps --ttft-p99-budget-s


def _profiles() -> tuple[str, ...]:
    from kvtier.probes.scrape.profiles import PROFILES

    return tuple(PROFILES)


def run(args) -> int:
    from kvtier.verbs.checks import positive
    from kvtier.verbs.collect_guardrail import budget_of

    positive(args.ttft_p99_budget_s, "--ttft-p99-budget-s")
    positive(args.itl_p99_budget_s, "--itl-p99-budget-s")
    positive(args.sustained_s, "--sustained-s")
    positive(args.window_s, "--window-s")
    budget = budget_of(args)
    args.ttft_p99_budget_s = budget.ttft_p99_s  # the budget in force, for the curves' headroom too
    if args.emit_monitoring:
        return _emit(args.emit_monitoring, budget)
    return _serve(args, budget)


def _emit(folder: str, budget) -> int:
    from kvtier.collector import json_text
    from kvtier.collector.exports.grafana import dashboard
    from kvtier.verbs.checks import output_dir
    from kvtier.policy.rollback.alerts import rules_yaml

    from kvtier.errors import failure

    out = output_dir(folder, "--emit-monitoring")
    try:
        out.mkdir(parents=True, exist_ok=True)
        json_text.write(out / "grafana-dashboard.json", dashboard(budget.ttft_p99_s, budget.itl_p99_s))
        (out / "kvtier-alerts.yml").write_text(rules_yaml(budget))
    except OSError as error:
        raise failure(f"--emit-monitoring {folder}: cannot write {error.filename or 'there'} "
                      f"({error.strerror or error}); give a writable folder with room") from None
    print(f"wrote {out / 'grafana-dashboard.json'} (import in Grafana) and {out / 'kvtier-alerts.yml'} "
          "(add to rule_files in prometheus.yml)")
    return 0


def _config(args):
    """The service configuration the flags describe; ``KvtierError`` naming a bad flag."""
    from pathlib import Path

    from kvtier.collector.service import CollectorConfig
    from kvtier.errors import KvtierError
    from kvtier.verbs.checks import non_empty, positive, writable_dir
    from kvtier.verbs.store import parse_duration_s

    positive(args.export_every_s, "--export-every-s")
    positive(args.duration_s, "--duration-s")
    positive(args.stop_grace_s, "--stop-grace-s", allow_zero=True)
    _check_scrape_interval(args.scrape_interval_s)
    non_empty(args.instance, "--instance")
    non_empty(args.scrape_instance, "--scrape-instance")
    if not 0 <= args.metrics_port < 65536:
        raise KvtierError(f"--metrics-port must be in 0..65535 (0: any free port), got {args.metrics_port}")
    store = Path(args.store)
    if store.is_dir():
        raise KvtierError(f"--store {store} is a folder; give a DuckDB file, e.g. {store / 'kvtier.duckdb'}")
    segments = writable_dir(args.segments, "--segments") if args.segments else None
    try:
        retention_s = parse_duration_s(args.retention) if args.retention else None
    except ValueError as error:
        raise KvtierError(f"--retention: {error}") from None
    positive(retention_s, "--retention")
    if args.otlp:
        _check_otlp_endpoint()
    return CollectorConfig(
        store_path=store, segments_dir=segments, export_every_s=args.export_every_s,
        retention_s=retention_s, metrics_host=args.metrics_host, metrics_port=args.metrics_port,
        otlp=args.otlp, recommendation_path=_recommendation(args.recommendation),
        stop_grace_s=args.stop_grace_s, **({"instance": args.instance} if args.instance else {}))


def _check_scrape_interval(interval_s: float) -> None:
    import math

    from kvtier.errors import KvtierError
    from kvtier.probes.scrape.scraper import MIN_INTERVAL_S

    if not (math.isfinite(interval_s) and interval_s >= MIN_INTERVAL_S):
        raise KvtierError(f"--scrape-interval-s must be at least {MIN_INTERVAL_S:g} s (each "
                          f"scrape costs the engine a render of its page), got {interval_s:g}")


def _recommendation(path):
    """The recommendation file: parsed once now, so a broken one is an error, not silence."""
    if not path:
        return None
    import json
    import sys
    from pathlib import Path

    from kvtier.errors import KvtierError

    file = Path(path)
    if not file.exists():
        print(f"kvtier collect: note: --recommendation {file} does not exist yet; it is exported "
              "once it appears", file=sys.stderr, flush=True)
        return file
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise KvtierError(f"--recommendation {file}: not a recommendation JSON ({error}); give "
                          "the recommendation.json that kvtier recommend wrote") from None
    if not isinstance(data, dict):
        raise KvtierError(f"--recommendation {file}: must hold a JSON object, as kvtier recommend writes")
    return file


def _check_otlp_endpoint() -> None:
    import os

    from kvtier.errors import KvtierError

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        value = os.environ.get(name)
        if value is not None and not value.startswith(("http://", "https://")):
            raise KvtierError(f"--otlp: {name}={value!r} is not an http(s) URL; set e.g. "
                              "http://127.0.0.1:4318")


def _serve(args, budget) -> int:
    import errno
    import signal
    import threading

    from kvtier.collector.service import CollectorService, ServiceStartError
    from kvtier.verbs.checks import address_error, warn_if_exposed, zmq_host

    config = _config(args)
    services = []  # the hooks tap asks the store where a restarted engine stream left off
    taps, flags = _taps(args, config.instance, services)
    from kvtier.verbs.collect_curves import curve_observers
    from kvtier.verbs.collect_guardrail import (
        guardrail_for,
        open_channel,
        promise_watch,
        started_line,
    )

    guardrail, token = guardrail_for(args, budget)
    watch = promise_watch(config.recommendation_path)
    observers = (*curve_observers(args, config.instance), *([guardrail] if guardrail else []),
                 *([watch] if watch else []))
    service = CollectorService(config, taps, observers=observers,
                               routes=guardrail.routes(token) if guardrail else None)
    services.append(service)
    open_channel(guardrail, args.guardrail_control)
    try:
        service.start()
        if guardrail is not None:
            guardrail.start(service.ingest)
        if watch is not None:
            watch.start(service.store)
    except ServiceStartError as error:
        if guardrail is not None:
            guardrail.stop()
        if error.part != "metrics":
            raise address_error(flags.get(error.part, "tap"), error.part, error.cause) from None
        if error.errno in (errno.EADDRINUSE, errno.EACCES):
            raise address_error("--metrics-port", f"{config.metrics_port} on {config.metrics_host}",
                                error.cause) from None
        raise address_error("--metrics-host", config.metrics_host, error.cause) from None
    if service.metrics is not None:
        warn_if_exposed("collect", "/metrics", service.metrics.host, service.metrics.port)
    for endpoint in args.hooks:
        host = zmq_host(endpoint)
        if host is not None:
            warn_if_exposed("collect", "--hooks", host, endpoint.rsplit(":", 1)[-1])
    if not args.vllm_connect:
        for flag, endpoints in (("--vllm-events", args.vllm_events),
                                ("--sglang-events", args.sglang_events)):
            for endpoint in endpoints:
                host = zmq_host(endpoint)
                if host is not None:
                    warn_if_exposed("collect", flag, host, endpoint.rsplit(":", 1)[-1])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # each stops it cleanly
        signal.signal(sig, lambda *_: stop.set())
    print(f"kvtier collect: storing into {config.store_path}", flush=True)
    if service.metrics is not None:
        print(f"kvtier collect: metrics at {service.metrics.url}", flush=True)
        print(f"kvtier collect: health at {service.metrics.health_url}", flush=True)
    for tap in service.health().taps:
        bound = ", ".join(tap.endpoints)  # shows the port chosen for :0
        bound = f", bound to {bound}" if bound and bound != tap.name else ""
        print(f"kvtier collect: tap {tap.kind} started ({tap.name}){bound}", flush=True)
    if guardrail is not None:
        print(started_line(guardrail), flush=True)
    try:
        if stop.wait(args.duration_s):
            print(f"kvtier collect: stopping; storing what already arrived (at most "
                  f"{config.stop_grace_s:g} s)", flush=True)
    finally:
        if guardrail is not None:
            guardrail.stop()
        summary = service.stop()
    print(f"kvtier collect: {_stopped(summary)}", flush=True)
    return 0


def _stopped(summary) -> str:
    """The last line: what the store holds after its last write, and what it did not get."""
    held = (f"stopped; the store holds {summary.batches:,} batches, {summary.block_events:,} "
            f"block events and {summary.requests:,} requests")
    if summary.damage:  # its catalog's counts no longer match the file
        held = f"stopped; {summary.damage}"
    lost = []
    if summary.unread_batches:
        lost.append(f"{summary.unread_batches:,} batch(es) that arrived were left unread (raise "
                    "--stop-grace-s)")
    if summary.dropped_batches:
        lost.append(f"{summary.dropped_batches:,} batch(es) were dropped because the store "
                    "refused writes")
    return held + ("; " + "; ".join(lost) if lost else "; nothing that arrived was lost")


def _taps(args, instance: str, services: list) -> tuple[list, dict[str, str]]:
    """Factories of the taps the flags ask for (each is built with the service's ingest), and
    each tap's name -> the flag it came from. ``services`` holds the service once built."""
    import functools

    from kvtier.errors import KvtierError

    taps, flags = [], {}
    if args.hooks:
        from kvtier.collector.hooks_tap import HooksTap, HooksTapConfig

        try:
            config = HooksTapConfig(endpoints=tuple(dict.fromkeys(args.hooks)))
        except ValueError as error:
            raise KvtierError(f"--hooks: {error}") from None

        def resume(source: str) -> int | None:
            return services[0].ledger.next_sequence(source)

        taps.append(functools.partial(HooksTap, config, resume=resume))
        flags[",".join(config.endpoints)] = "--hooks"
    if args.vllm_replay and not args.vllm_events:
        raise KvtierError("--vllm-replay needs --vllm-events: the replay endpoint heals that stream")

    def latest_source(prefix: str):
        return services[0].ledger.latest_source(prefix)

    for flag, engine, endpoints in (("--vllm-events", "vllm", args.vllm_events),
                                    ("--sglang-events", "sglang", args.sglang_events),
                                    ("--dynamo-events", "dynamo", args.dynamo_events)):
        if not endpoints:
            continue
        from kvtier.probes.vllm.tap import VllmEventTap, VllmTapConfig

        replays = tuple(enumerate(args.vllm_replay)) if engine == "vllm" else ()
        bind = not args.vllm_connect and engine != "dynamo"  # a Dynamo worker binds its publisher
        try:  # the user typed the address: a non-loopback bind is warned about, not refused
            # one store batch per stream per poll: the store's cost is per batch
            config = VllmTapConfig(endpoints=tuple(endpoints), bind=bind,
                                   replay_endpoints=replays, instance=instance, engine=engine,
                                   allow_all_interfaces=True, coalesce_frames=True)
        except ValueError as error:
            raise KvtierError(f"{flag}: {error}") from None
        # a restarted collector goes on from the streams its store holds
        taps.append(functools.partial(VllmEventTap, config, resume=latest_source))
        flags[",".join(config.endpoints)] = flag
    for url in args.trtllm_events:
        from kvtier.probes.trtllm.events import TrtllmEventPoller, TrtllmPollerConfig

        if not url.startswith(("http://", "https://")):
            raise KvtierError(f"--trtllm-events {url!r} is not an http(s) URL; give e.g. "
                              "http://127.0.0.1:8000/kv_cache_events")
        taps.append(functools.partial(TrtllmEventPoller, TrtllmPollerConfig(url=url, instance=instance)))
        flags[url] = "--trtllm-events"
    for value in args.scrape:
        from kvtier.probes.scrape.metrics_tap import ScrapeTap

        config = _scrape_config(value, args.scrape_instance or instance, args.scrape_interval_s)
        taps.append(functools.partial(ScrapeTap, config))
        flags[config.url] = "--scrape"
    return taps, flags


def _scrape_config(value: str, instance: str, interval_s: float):
    """``URL`` or ``URL=PROFILE`` -> the scrape tap's configuration; ``KvtierError`` naming
    the flag. What follows the last ``=`` names a profile, which must be one of the registry's;
    it is the URL's own (a query string's value) only where the URL has a ``?`` or the text
    is no name at all."""
    from kvtier.errors import KvtierError
    from kvtier.probes.scrape.metrics_tap import ScrapeTapConfig

    profiles = _profiles()
    url, sep, profile = value.rpartition("=")
    if not sep or (profile not in profiles and ("?" in url or not profile.isidentifier())):
        url, profile = value, None
    elif profile not in profiles:
        raise KvtierError(f"--scrape {value!r}: unknown profile {profile!r}; known: "
                          f"{', '.join(profiles)} (or give the URL alone: the profile is then "
                          "guessed from the page)")
    try:
        return ScrapeTapConfig(url=url, engine=profile, instance=instance, interval_s=interval_s)
    except ValueError as error:
        raise KvtierError(f"--scrape {value!r}: {error}; give e.g. "
                          "http://127.0.0.1:8000/metrics or http://127.0.0.1:8000/metrics=vllm") from None
