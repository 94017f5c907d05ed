"""`kvtier collect`'s guardrail: its flags, and the guardrail they build. Standard library
only at import: this runs while ``kvtier --help`` builds its parser."""

from kvtier.errors import KvtierError

TOKEN_VARIABLE = "KVTIER_GUARDRAIL_TOKEN"
DEFAULT_CONTROL = "tcp://127.0.0.1:5571"


def add_guardrail_arguments(parser) -> None:
    group = parser.add_argument_group(
        "guardrail", "the rollback rule, live: per instance, p99 TTFT/ITL per --window-s against "
        "the budget (the --recommendation's rule, else the budget flags) for --sustained-s; in act "
        "mode the newest tier's loads are paused in the engines through their connector "
        "(README: Guardrail)")
    group.add_argument("--guardrail", choices=("off", "observe", "act"), default="observe",
                       help="off; observe (default): decide, record and export, never act; act: "
                            "also tell the engines (needs a token)")
    group.add_argument("--guardrail-token-file", metavar="FILE",
                       help=f"the token shared with the engines' kvtier_control_token (or "
                            f"${TOKEN_VARIABLE}): opens the control channel")
    group.add_argument("--guardrail-control", default=DEFAULT_CONTROL, metavar="ENDPOINT",
                       help=f"bind the control channel here (default {DEFAULT_CONTROL}, loopback)")
    group.add_argument("--window-s", type=int, default=120,
                       help="rollback rule: the window each p99 is taken over (default 120)")
    group.add_argument("--guardrail-step-s", type=float, default=15.0,
                       help="how often the rule is evaluated (default 15)")
    group.add_argument("--guardrail-hold-s", type=float, default=300.0,
                       help="a pause lasts at least this long; a pause soon after a resume "
                            "twice as long as the last, up to 12x (default 300)")
    group.add_argument("--guardrail-resume-ratio", type=float, default=0.8,
                       help="resume once every p99 stays at or below this share of its budget "
                            "for --sustained-s (default 0.8)")
    group.add_argument("--guardrail-tier", choices=("cpu", "cold"),
                       help="the tier to pause (default: each instance's newest)")
    group.add_argument("--guardrail-pause-stores", action="store_true",
                       help="pause the tier's stores with its loads")
    group.add_argument("--guardrail-costs", metavar="FILE",
                       help="kvtier calibrate --out: act mode also recomputes a request's prefix "
                            "when its load would wait longer than recomputing it")


def budget_of(args):
    """The rollback rule's budget: each flag given, else the ``--recommendation``'s rule where
    it has one, else the rule's defaults."""
    from dataclasses import replace

    from kvtier.policy.rollback.rule import LatencyBudget

    rule = _rule(args.recommendation)
    given = {"ttft_p99_s": args.ttft_p99_budget_s, "itl_p99_s": args.itl_p99_budget_s,
             "sustained_s": args.sustained_s, "window_s": args.window_s}
    recommended = {} if rule is None else {
        "ttft_p99_s": rule.ttft_p99_s, "itl_p99_s": rule.itl_p99_s,
        "sustained_s": rule.sustained_s, "window_s": rule.window_s}
    chosen = {name: value if value is not None else recommended.get(name)
              for name, value in given.items()}
    try:
        return replace(LatencyBudget(), **{k: v for k, v in chosen.items() if v is not None})
    except ValueError as error:
        raise KvtierError(f"rollback rule: {error}") from None


def open_channel(guardrail, endpoint: str) -> None:
    """Bind the guardrail's control channel (before the store opens: a busy endpoint leaves
    nothing behind); ``KvtierError`` naming ``--guardrail-control`` when it cannot."""
    from kvtier.verbs.checks import address_error, warn_if_exposed, zmq_host

    if guardrail is None or guardrail.sender is None:
        return
    try:
        guardrail.sender.open()
    except OSError as error:
        raise address_error("--guardrail-control", endpoint, error) from None
    channel = guardrail.sender.bound[0]
    if (host := zmq_host(channel)) is not None:
        warn_if_exposed("collect", "--guardrail-control", host, channel.rsplit(":", 1)[-1])


def started_line(guardrail) -> str | None:
    """What ``kvtier collect`` says of its guardrail once it runs."""
    if guardrail is None:
        return None
    channel = guardrail.sender.bound[0] if guardrail.sender is not None else None
    return (f"kvtier collect: guardrail {guardrail.mode}"
            + (f", control channel at {channel}" if channel else ", no control channel"))


def guardrail_for(args, budget):
    """The guardrail and its token (``None`` without one) the flags ask for, or
    ``(None, None)`` with ``--guardrail off`` and no token; ``KvtierError`` naming a bad flag."""
    from kvtier.guardrail.watch import Guardrail, GuardrailConfig
    from kvtier.policy.rollback.live_rule import GuardrailSettings

    token = read_token(args.guardrail_token_file)
    if args.guardrail == "act" and token is None:
        raise KvtierError(f"--guardrail act needs the engines' shared token: "
                          f"--guardrail-token-file FILE or ${TOKEN_VARIABLE}")
    if args.guardrail == "off" and token is None:
        return None, None
    try:
        settings = GuardrailSettings(args.guardrail, budget, args.guardrail_step_s,
                                     args.guardrail_resume_ratio, args.guardrail_hold_s,
                                     12 * args.guardrail_hold_s)
        config = GuardrailConfig(settings, args.guardrail_tier, args.guardrail_pause_stores,
                                 _costs(args.guardrail_costs))
        return Guardrail(config, _sender(token, args.guardrail_control)), token
    except ValueError as error:
        raise KvtierError(f"--guardrail: {error}") from None


def read_token(path: str | None, flag: str = "--guardrail-token-file") -> bytes | None:
    import os
    from pathlib import Path

    from kvtier.collector.control import check_token

    try:
        text = Path(path).read_text().strip() if path else os.environ.get(TOKEN_VARIABLE)
        return None if text is None else check_token(text.encode())
    except OSError as error:
        raise KvtierError(f"{flag} {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise KvtierError(f"{flag}: {error}") from None


def _sender(token: bytes | None, endpoint: str):
    if token is None:
        return None
    from kvtier.collector.control_sender import ControlSender

    if "://" not in endpoint:
        raise KvtierError(f"--guardrail-control {endpoint!r} is not a ZMQ endpoint; give e.g. "
                          f"{DEFAULT_CONTROL}")
    return ControlSender(token, endpoint)


def _costs(path: str | None):
    """The link costs in a ``kvtier calibrate --out`` file: a load job's fixed cost, each
    byte's transfer over the CPU link, a prompt token's prefill."""
    if not path:
        return None
    from kvtier.collector.control import LinkCosts
    from kvtier.policy.cost import CostParams
    from kvtier.verbs.common import cost_params_file

    params = cost_params_file(path, CostParams())
    return LinkCosts(params.cpu_gpu_op_latency_s.value, 1.0 / params.cpu_gpu_bandwidth_bytes_per_s.value,
                     1.0 / params.prefill_tokens_per_s.value)


def _rule(path: str | None):
    if not path:
        return None
    import json
    from pathlib import Path

    from kvtier.policy.recommend.recommendation import from_json

    try:
        return from_json(json.loads(Path(path).read_text())).evidence.rollback
    except (OSError, ValueError, AttributeError):
        return None  # collect's own check of --recommendation says what is wrong with it


def promise_watch(recommendation):
    """The live check of ``--recommendation``'s promises (``None`` without one)."""
    if recommendation is None:
        return None
    from kvtier.guardrail.promise_watch import PromiseWatch

    return PromiseWatch(recommendation)
