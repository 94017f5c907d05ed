"""`kvtier guardrail status|pause|resume`: what the collector's guardrail holds and has done,
and an operator's hand on it, through the same channel the rule acts on."""

from __future__ import annotations

SUMMARY = ("the live rollback rule: its state and moves per instance (status), an operator's "
           "pause or resume of a tier's loads or stores in the engines")
EXAMPLE = ("kvtier guardrail status --collector http://127.0.0.1:9400  |  kvtier guardrail pause "
           "--instance node-7 --loads --token-file /etc/kvtier/control-token  |  kvtier guardrail "
           "resume --instance node-7 --loads --stores --token-file /etc/kvtier/control-token")
DEFAULT_COLLECTOR = "http://127.0.0.1:9400"


def add_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    status = actions.add_parser("status", help="the mode, the budget and each instance's state "
                                               "and recent moves")
    status.add_argument("--json", action="store_true", help="print the collector's JSON")
    status.add_argument("--moves", type=int, default=10, help="recent moves to list per instance")
    for name, what in (("pause", "pause a tier's loads and/or stores in an instance's engines "
                                 "(held until an operator resumes)"),
                       ("resume", "resume them (the rule takes over again)")):
        sub = actions.add_parser(name, help=what)
        sub.add_argument("--instance", required=True, help="the engines' kvtier_instance")
        sub.add_argument("--loads", action="store_true", help="the tier's loads (default)")
        sub.add_argument("--stores", action="store_true", help="the tier's stores")
        sub.add_argument("--tier", choices=("cpu", "cold"),
                         help="the tier (default: the instance's newest)")
        sub.add_argument("--token-file", help="the control token the collector and engines share "
                                              "(or $KVTIER_GUARDRAIL_TOKEN)")
    for sub in actions.choices.values():
        sub.add_argument("--collector", default=DEFAULT_COLLECTOR,
                         help=f"the collector's HTTP address (its --metrics-port; default "
                              f"{DEFAULT_COLLECTOR})")


def run(args) -> int:
    from kvtier.guardrail.client import GuardrailClient, print_status

    client = GuardrailClient(_base(args.collector))
    if args.action == "status":
        status = client.status()
        if args.json:
            from kvtier.collector import json_text

            print(json_text.dumps(status, indent=2))
        else:
            print_status(status, args.moves)
        return 0
    from kvtier.verbs.collect_guardrail import read_token

    token = read_token(args.token_file, "--token-file")
    if token is None:
        from kvtier.errors import KvtierError

        raise KvtierError("give the control token: --token-file FILE or $KVTIER_GUARDRAIL_TOKEN")
    directions = tuple(d for d, on in (("loads", args.loads), ("stores", args.stores)) if on)
    answer = client.command(token, args.action, args.instance, directions or ("loads",), args.tier)
    print(f"{args.instance}: {answer['moved']} sent (command {answer['command']}); its requests "
          f"now carry {answer['tier_config']}")
    return 0


def _base(url: str) -> str:
    from kvtier.errors import KvtierError

    if not url.startswith(("http://", "https://")):
        raise KvtierError(f"--collector {url!r} is not an http(s) URL; give e.g. {DEFAULT_COLLECTOR}")
    return url.rstrip("/").removesuffix("/metrics")
