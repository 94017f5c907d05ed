"""`kvtier engine`: serve the reference engine (OpenAI API, vLLM KV events, /metrics)."""

SUMMARY = "serve kvtier's reference engine: OpenAI /v1/completions, vLLM KV events, /metrics"
EXAMPLE = ("kvtier engine --port 8000 --gpu-blocks 64 --cpu-blocks 256 --cold-blocks 1024 "
           "--file-dir /tmp/kvtier-files --kv-events tcp://127.0.0.1:5557 --store traces.duckdb")


def add_arguments(parser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (0: any free port)")
    parser.add_argument("--gpu-blocks", type=int, default=64, help="GPU tier capacity in blocks")
    parser.add_argument("--cpu-blocks", type=int, default=0, help="CPU tier capacity (0: none)")
    parser.add_argument("--cold-blocks", "--file-blocks", dest="cold_blocks", type=int, default=0,
                        help="cold tier capacity, files in --file-dir (0: none)")
    parser.add_argument("--file-dir", help="folder of the cold tier's files (needed with --cold-blocks)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--eviction-policy", default="lru", help="lru or fifo, in every tier")
    parser.add_argument("--admission-threshold", type=int, default=0,
                        help="store a block in a lower tier only after this many uses")
    parser.add_argument("--config-id", default=None, help="name of this tier configuration")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a busy few-core host, more "
                             "threads stall each copy for a scheduler time slice)")
    parser.add_argument("--kv-events", metavar="ENDPOINT",
                        help="publish vLLM KV events on this ZMQ PUB endpoint")
    parser.add_argument("--kv-events-replay", metavar="ENDPOINT", help="ROUTER replay endpoint")
    parser.add_argument("--store", help="DuckDB trace store for the engine's own records")


def config_from_args(args):
    """The engine configuration the flags describe; ``KvtierError`` naming a bad flag."""
    from kvtier.errors import KvtierError
    from kvtier.errors import flag_names
    from kvtier.refengine.config import EngineConfig, TierConfig

    if args.block_size < 1:
        raise KvtierError(f"--block-size must be >= 1 tokens, got {args.block_size}")
    if args.cold_blocks and not args.file_dir:
        raise KvtierError(f"--cold-blocks {args.cold_blocks} needs --file-dir, the folder of the "
                          "cold tier's files")
    if args.file_dir:
        from pathlib import Path

        if Path(args.file_dir).exists() and not Path(args.file_dir).is_dir():
            raise KvtierError(f"--file-dir {args.file_dir} is a file; give a folder (created if missing)")
    tier_id = args.config_id or _default_id(args)
    try:
        tiers = TierConfig(gpu_blocks=args.gpu_blocks, cpu_blocks=args.cpu_blocks,
                           cold_blocks=args.cold_blocks, eviction_policy=args.eviction_policy,
                           admission_threshold=args.admission_threshold, config_id=tier_id)
        return EngineConfig(layers=args.layers, heads=args.heads, head_dim=args.head_dim,
                            vocab_size=args.vocab_size, block_size_tokens=args.block_size,
                            max_batch_size=args.max_batch_size, seed=args.seed, tiers=tiers,
                            file_dir=args.file_dir)
    except ValueError as error:  # the configuration's names, as this verb's flags
        raise KvtierError(flag_names(str(error), getattr(args, "_flags", {}))) from None


def _settings(args):
    from kvtier.errors import KvtierError
    from kvtier.refengine.server import ServerSettings

    if not 0 <= args.port < 65536:
        raise KvtierError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    for flag, endpoint in (("--kv-events", args.kv_events), ("--kv-events-replay", args.kv_events_replay)):
        if endpoint is not None and endpoint.split("://", 1)[0] not in ("tcp", "ipc", "inproc"):
            raise KvtierError(f"{flag} {endpoint!r} is not a ZMQ endpoint; give e.g. tcp://127.0.0.1:5557")
    if args.store:
        from kvtier.verbs.checks import output_file

        output_file(args.store, "--store")
    return ServerSettings(host=args.host, port=args.port, kv_events_endpoint=args.kv_events,
                          kv_events_replay_endpoint=args.kv_events_replay, store_path=args.store)


def _start(server_class, config, settings, args):
    """Bind everything, or stop what was started and say which flag's address failed."""
    import zmq

    from kvtier.verbs.checks import address_error, warn_if_exposed, zmq_host

    try:  # the KV-event publisher binds as it is built
        server = server_class(config, settings)
    except zmq.ZMQError as error:
        flag = "--kv-events-replay" if args.kv_events_replay and "replay" in str(error) else "--kv-events"
        raise address_error(flag, args.kv_events, OSError(error.errno, error.strerror)) from None
    try:
        server.start()
    except OSError as error:
        server.stop()
        if getattr(error, "errno", None) in (98, 13):  # in use, permission: the port
            raise address_error("--port", f"{args.port} on {args.host}", error) from None
        raise address_error("--host", args.host, error) from None
    except BaseException:
        server.stop()
        raise
    warn_if_exposed("engine", "the OpenAI API", args.host, server.url.rsplit(":", 1)[-1])
    for endpoint in (args.kv_events, args.kv_events_replay):
        host = zmq_host(endpoint) if endpoint else None
        if host is not None:
            warn_if_exposed("engine", "the KV-event publisher", host, endpoint.rsplit(":", 1)[-1])
    return server


def _default_id(args) -> str:
    parts = [f"gpu{args.gpu_blocks}"]
    if args.cpu_blocks:
        parts.append(f"cpu{args.cpu_blocks}")
    if args.cold_blocks:
        parts.append(f"file{args.cold_blocks}")
    return "-".join(parts)


def run(args) -> int:
    import threading

    from kvtier.errors import KvtierError
    from kvtier.signals import stop_on_signals
    from kvtier.refengine.server import EngineServer

    config = config_from_args(args)
    if args.torch_threads < 1:
        raise KvtierError(f"--torch-threads must be >= 1, got {args.torch_threads}")
    settings = _settings(args)  # every flag checked before torch loads
    import torch

    torch.set_num_threads(args.torch_threads)  # process-wide: this is the process's entry point
    # Ctrl-C, SIGTERM and SIGHUP stop it cleanly: flush the store, close sockets
    with stop_on_signals():
        server = _start(EngineServer, config, settings, args)
        try:
            print(f"reference engine on {server.url} (model kvtier-reference, tiers {config.tiers.config_id})")
            if server.publisher is not None:
                print(f"KV events on {server.publisher.endpoint}"
                      + (f", replay {server.publisher.replay_endpoint}" if server.publisher.replay_endpoint else ""))
            print("Ctrl-C stops it.", flush=True)
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
    return 0
