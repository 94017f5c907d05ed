"""`kvtier collect`: run the collector: event taps, scrapers, ingest, /metrics, OTLP export"""

from kvtier.verbs import not_yet

SUMMARY = "run the collector: event taps, scrapers, ingest, /metrics, OTLP export"
EXAMPLE = "kvtier collect --store kvtier.duckdb --vllm-events tcp://127.0.0.1:5557 --metrics-port 9400"


def add_arguments(parser) -> None:
    parser.add_argument("--store", default="kvtier-out/kvtier.duckdb", help="DuckDB store file")
    parser.add_argument("--vllm-events", help="ZMQ endpoint of a vLLM KV-event stream")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this loopback port")


def run(args) -> int:
    raise not_yet("collect", 7, "the collector service with taps and exports")
