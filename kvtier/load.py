"""The load probe wired to a trace and a store, for `kvtier probe load` and the rollout."""

from __future__ import annotations

import functools
import itertools
import time
from pathlib import Path

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin
from kvtier.errors import KvtierError
from kvtier.traces import bundled_trace
from kvtier.probes.active.client import stream_completion
from kvtier.probes.active.load import LoadConfig, LoadResult, run_load


def run_load_from_args(args, concurrency: tuple[int, ...], progress) -> LoadResult:
    from kvtier.policy.readers import open_trace

    trace_path = Path(args.trace) if args.trace else bundled_trace()
    if args.offset < 0 or args.max_blocks < 1:
        raise ValueError(f"--offset must be >= 0 and --max-blocks >= 1, got {args.offset}, {args.max_blocks}")
    config = LoadConfig(concurrency=concurrency, requests_per_level=args.requests,
                        max_tokens=args.max_tokens, block_tokens=args.block_tokens,
                        max_blocks=args.max_blocks, vocab_size=args.vocab_size,
                        tier_config_id=args.phase)
    if args.trace:
        from kvtier.verbs.checks import input_path

        input_path(args.trace, "--trace")
    trace = itertools.islice(open_trace(trace_path).requests(), args.offset, None)  # its errors first
    if args.store:
        from kvtier.verbs.checks import output_file

        output_file(args.store, "--store")
    check_server(args.url, "--url")
    send = functools.partial(_send, args.url)
    result = run_load(trace, send, config, progress=progress)
    if result.errors and not result.records:
        raise KvtierError(f"all {len(result.errors)} requests failed; the first: {result.errors[0]}")
    if args.store:
        store_result(result, args.store, args.url)
    return result


def _send(url, prompt_ids, max_tokens, **request):
    return stream_completion(url, prompt_ids, max_tokens, **request)


def check_server(url: str, flag: str) -> None:
    """Raise a one-line ``KvtierError`` unless an OpenAI-compatible server answers at ``url``
    (exit 2 for a URL that cannot be one, 1 when nothing answers there)."""
    import urllib.error
    import urllib.request

    from kvtier.errors import failure

    if not url.startswith(("http://", "https://")):
        raise KvtierError(f"{flag} {url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8000")
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10):
            return
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise failure(f"{flag} {url}: no OpenAI-compatible server answers ({reason}); start one, "
                      "e.g. 'kvtier engine --port 8000'") from None


def store_result(result: LoadResult, path: str, url: str, *, clock=time.time) -> int:
    """Ingest the run's request rows as one batch; returns rows stored."""
    from kvtier.collector.store import TraceStore

    origin = Origin("load-probe", url, f"load-probe/{result.run_id}")
    with TraceStore(path) as store:
        return store.ingest(EventBatch.from_rows(origin, 0, requests=result.records)).requests
