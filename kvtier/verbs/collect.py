"""`kvtier collect`: the collector service, or the monitoring files for an existing stack."""

SUMMARY = "run the collector: event taps, ingest into DuckDB, Prometheus /metrics, OTLP, Parquet segments"
EXAMPLE = ("kvtier collect --store kvtier-out/kvtier.duckdb --vllm-events tcp://127.0.0.1:5557 "
           "--metrics-port 9400 --segments kvtier-out/segments")


def add_arguments(parser) -> None:
    parser.add_argument("--store", default="kvtier-out/kvtier.duckdb", help="DuckDB store file (created if new)")
    parser.add_argument("--segments", help="write Parquet segments here (what the dashboard reads)")
    parser.add_argument("--export-every-s", type=float, default=60.0, help="segment export period")
    parser.add_argument("--retention", help="delete records older than this (e.g. 7d, 12h)")
    parser.add_argument("--vllm-events", action="append", default=[], metavar="ENDPOINT",
                        help="bind this ZMQ endpoint for vLLM's KV-event publisher (repeatable)")
    parser.add_argument("--vllm-connect", action="store_true", help="connect to the endpoints instead of binding")
    parser.add_argument("--trtllm-events", action="append", default=[], metavar="URL",
                        help="poll TensorRT-LLM's /kv_cache_events at this URL (repeatable)")
    parser.add_argument("--instance", help="name of the serving instance (default: host name)")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="address for /metrics (default loopback)")
    parser.add_argument("--metrics-port", type=int, default=9400, help="port for /metrics (0: any free port)")
    parser.add_argument("--otlp", action="store_true",
                        help="export metrics and request spans over OTLP/HTTP (OTEL_EXPORTER_OTLP_* variables)")
    parser.add_argument("--recommendation", metavar="FILE",
                        help="recommendation.json to export as kvtier_recommendation_info (re-read when it changes)")
    parser.add_argument("--duration-s", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    parser.add_argument("--emit-monitoring", metavar="DIR",
                        help="write the Grafana dashboard and Prometheus alert rules to DIR and exit")
    parser.add_argument("--ttft-p99-budget-s", type=float, default=2.0, help="rollback rule: p99 TTFT budget")
    parser.add_argument("--itl-p99-budget-s", type=float, default=0.1, help="rollback rule: p99 ITL budget")
    parser.add_argument("--sustained-s", type=int, default=300, help="rollback rule: how long a breach must last")


def run(args) -> int:
    from policy.rollback.rule import LatencyBudget

    budget = LatencyBudget(args.ttft_p99_budget_s, args.itl_p99_budget_s, args.sustained_s)
    if args.emit_monitoring:
        return _emit(args.emit_monitoring, budget)
    return _serve(args)


def _emit(folder: str, budget) -> int:
    import json
    from pathlib import Path

    from policy.rollback.alerts import rules_yaml
    from collector.exports.grafana import dashboard

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grafana-dashboard.json").write_text(json.dumps(dashboard(budget.ttft_p99_s, budget.itl_p99_s), indent=2) + "\n")
    (out / "kvtier-alerts.yml").write_text(rules_yaml(budget))
    print(f"wrote {out / 'grafana-dashboard.json'} (import in Grafana) and {out / 'kvtier-alerts.yml'} "
          "(add to rule_files in prometheus.yml)")
    return 0


def _serve(args) -> int:
    import signal
    import threading
    from pathlib import Path

    from collector.service import CollectorConfig, CollectorService
    from kvtier.verbs.store import parse_duration_s

    config = CollectorConfig(
        store_path=Path(args.store), segments_dir=Path(args.segments) if args.segments else None,
        export_every_s=args.export_every_s,
        retention_s=parse_duration_s(args.retention) if args.retention else None,
        metrics_host=args.metrics_host, metrics_port=args.metrics_port, otlp=args.otlp,
        recommendation_path=Path(args.recommendation) if args.recommendation else None, **({"instance": args.instance} if args.instance else {}))
    service = CollectorService(config, _taps(args, config.instance)).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"kvtier collect: storing into {config.store_path}", flush=True)
    if service.metrics is not None:
        print(f"kvtier collect: metrics at {service.metrics.url}", flush=True)
    for tap in service.taps:
        print(f"kvtier collect: tap {type(tap).__name__} running", flush=True)
    stop.wait(args.duration_s)
    stored = service.store.count("block_events"), service.store.count("requests")
    service.stop()
    print(f"kvtier collect: stopped; the store holds {stored[0]:,} block events and {stored[1]:,} requests",
          flush=True)
    return 0


def _taps(args, instance: str) -> list:
    """Factories of the taps the flags ask for; each is built with the service's ingest."""
    import functools

    taps = []
    if args.vllm_events:
        from probes.vllm.tap import VllmEventTap, VllmTapConfig

        config = VllmTapConfig(endpoints=tuple(args.vllm_events), bind=not args.vllm_connect,
                               instance=instance)
        taps.append(functools.partial(VllmEventTap, config))
    for url in args.trtllm_events:
        from probes.trtllm.events import TrtllmEventPoller, TrtllmPollerConfig

        taps.append(functools.partial(TrtllmEventPoller, TrtllmPollerConfig(url=url, instance=instance)))
    return taps
