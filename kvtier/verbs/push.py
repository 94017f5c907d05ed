"""`kvtier push`: apply a recommendation to an engine config file, atomically, with a diff and guardrails"""

SUMMARY = "apply a recommendation to an engine config file, atomically, with a diff and guardrails"
EXAMPLE = ("kvtier push --recommendation reco/recommendation.json --engine vllm --config serve.yaml "
           "--dry-run   # show the diff; then again without --dry-run")
DESCRIPTION = f"""{SUMMARY}.

What it changes: only the offload settings the recommendation holds (CPU tier size, cold
tier, eviction policy, store threshold, chunk size, KV events on or off).
What it keeps: every other key, comment, key spelling, byte-order mark and line end; in a
vLLM config, the connector and spec it loads when they are vLLM's OffloadingConnector or
kvtier's recording KvtierOffloadingConnector and specs (module paths and kvtier_* keys too),
and the KV-events endpoints (it never adds one). Another connector (LMCache's, say) is
replaced only with --force. vLLM's kv-offloading-size and kv-offloading-backend keys are
removed (vLLM would override the kv-transfer-config's connector and size with them): the
CPU tier moves onto kvtier's recording connector, or the one the file's kv-transfer-config
names, with a note (the lmcache backend only with --force); a note says which connector
and size vLLM will run. cpu_tier_bytes 0 keeps the connector loaded with a 1-byte CPU
tier (nothing offloaded), so kvtier goes on recording.
What it reads: regular files only, up to 1 MiB of config and 16 MiB of recommendation, no
deeper than 64 levels, YAML aliases within bounds.
How it writes: under a lock on the file (a second push at the same time stops, exit 2), the
old file first to a backup next to it (FILE.kvtier-TIME.bak), then the new one in a single
rename; a link is kept and the file it names is edited. The new file keeps the old one's
mode, and its owner and group where you may give them (root may; a note says what changes);
a file you may not write is refused, though its folder would let the rename replace it."""



def add_arguments(parser) -> None:
    from kvtier.policy.writers import WRITERS

    files = "; ".join(f"{engine}: {module.FILE_HELP}" for engine, module in WRITERS.items())
    parser.add_argument("--recommendation", required=True,
                        help="recommendation JSON: recommendation.json (every engine's settings) "
                             "or recommendation.ENGINE.json, as kvtier recommend writes them")
    parser.add_argument("--engine", required=True, choices=tuple(WRITERS),
                        help="the engine to configure")
    parser.add_argument("--config", required=True, help=f"the engine config file to update ({files})")
    parser.add_argument("--host-headroom-bytes", type=int, default=None,
                        help="the engine host's DRAM headroom for the CPU tier (default: this "
                             "host's, measured now, and the recommendation's own)")
    parser.description = DESCRIPTION
    parser.add_argument("--force", action="store_true",
                        help="push a CPU tier larger than the host headroom anyway, and replace "
                             "a vLLM connector that is not an offloading one")
    parser.add_argument("--dry-run", action="store_true", help="show the diff, change nothing")


def run(args) -> int:
    from kvtier.errors import failure

    try:
        return _push(args)
    except MemoryError:  # a huge recommendation or config file; push has no size flag
        raise failure(f"out of memory reading {args.recommendation} or {args.config}; nothing "
                      "changed (give the files kvtier recommend and the engine use)") from None


def _push(args) -> int:
    from dataclasses import replace

    from kvtier.errors import KvtierError, failure
    from kvtier.policy.writers.push import PushRefused, apply, load_recommendation, plan

    if args.host_headroom_bytes is not None and args.host_headroom_bytes < 0:
        raise KvtierError(f"--host-headroom-bytes must be >= 0, got {args.host_headroom_bytes}")
    try:
        loaded = load_recommendation(args.recommendation, args.engine)
    except PushRefused as exc:
        raise KvtierError(f"push refused: {exc}") from None
    settings = loaded.settings
    try:  # the file first (its errors do not depend on this machine); the host check below
        push = plan(settings, replace(loaded.guardrails, host_headroom_bytes=None), args.engine,
                    args.config, force=args.force)
    except (PushRefused, ValueError) as exc:
        raise KvtierError(f"push refused: {exc}") from None
    _check_host(settings.cpu_tier_bytes, loaded.guardrails.host_headroom_bytes, args)
    if loaded.source != str(args.recommendation):
        print(f"reading {loaded.source}")
    print(push.diff if push.changed else f"{push.path}: already up to date, nothing to change",
          end="" if push.changed else "\n")
    for note in push.notes:
        print(f"note: {note}")
    if args.dry_run or not push.changed:
        if args.dry_run and push.changed:
            print("dry run: nothing written")
        return 0
    try:
        backup = apply(push)
    except PushRefused as exc:  # another push holds the file, or changed it since the diff
        raise KvtierError(f"push stopped: {exc}") from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise failure(f"push failed writing {push.written}: {reason}; nothing changed (no "
                      "backup left)") from None
    print(f"wrote {push.written}" + (f" (backup: {backup})" if backup else " (new file)"))
    return 0


def _check_host(cpu_bytes: int | None, recommended_headroom: int | None, args) -> None:
    """Refuse a CPU tier above the host's memory: the headroom given, else the smaller of
    this host's (measured now) and the one the recommendation was made with."""
    import sys

    from kvtier.errors import KvtierError

    if not cpu_bytes:
        return
    limits = []
    if args.host_headroom_bytes is not None:
        limits.append((args.host_headroom_bytes, "--host-headroom-bytes"))
    else:
        if recommended_headroom is not None:
            limits.append((recommended_headroom, "the host headroom the recommendation was made with"))
        from kvtier.host import measured_host_limit

        host = measured_host_limit()
        if host is not None:
            limits.append((host.cap_bytes, "this host's memory headroom (measured now; give "
                                           "--host-headroom-bytes for the engine's host)"))
    over = [(limit, what) for limit, what in limits if cpu_bytes > limit]
    if not over:
        return
    limit, what = min(over)
    message = (f"the CPU tier ({_gib(cpu_bytes)}, cpu_tier_bytes={cpu_bytes}) exceeds {what}: "
               f"{_gib(limit)}")
    if args.force:
        print(f"kvtier push: warning: {message}; pushed anyway (--force)", file=sys.stderr, flush=True)
        return
    raise KvtierError(f"push refused: {message}; lower it, or add --force to push it anyway")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
