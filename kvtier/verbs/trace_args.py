"""Command-line options the policy verbs share. Standard library only: this runs while
``kvtier --help`` builds its parser."""

from kvtier.errors import KvtierError
from kvtier.policy.trace_formats import FORMATS
from kvtier.verbs.arg_types import int_at_least


def add_trace_arguments(parser) -> None:
    """``--format``, ``--block-tokens``, ``--skip-bad``, ``--weka-start-gap-s``,
    ``--tier-config``, ``--source-engine``, ``--model``, ``--kv-bytes-per-token``, ``--instance``, ``--jobs``,
    ``--ray``."""
    parser.add_argument("--format", choices=FORMATS, help="trace format (detected when omitted)")
    parser.add_argument("--block-tokens", type=int,
                        help="tokens per block id (default: the format's, e.g. 512 for Mooncake)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip and count bad trace lines instead of stopping at the first")
    parser.add_argument("--weka-start-gap-s", type=float, default=60.0,
                        help="WEKA: seconds between conversation starts (default 60)")
    parser.add_argument("--tier-config", dest="tier_config",
                        help="a store: only requests served under this tier configuration")
    parser.add_argument("--source-engine", dest="source_engine",
                        help="a store: only requests this engine recorded (e.g. load-probe, "
                             "reference)")
    parser.add_argument("--model",
                        help="KV geometry by model name: needed for byte capacities (16GiB) of a "
                             "trace; a store's own block events give it otherwise (costs use "
                             "llama-3.1-8b when nothing does, and reports say so)")
    parser.add_argument("--kv-bytes-per-token", type=int, dest="kv_bytes_per_token",
                        help="KV geometry as KV cache bytes per token (all layers, key and "
                             "value), for a model --model does not list, e.g. 131072")
    parser.add_argument("--instance",
                        help="a store or segment folder: analyse only this serving instance")
    parser.add_argument("--jobs", type=int_at_least(1), default=1,
                        help="a store or segment folder of several instances is analysed per "
                             "instance (each has its own cache) and the results merged: in N "
                             "worker processes at a time (default 1; simulate stays in one "
                             "process below 1 MiB of trace, where starting workers costs more "
                             "than it saves), e.g. --jobs 2")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="run the instances of a store or segment folder as tasks on the Ray "
                             "cluster at ADDRESS (host:port, or auto) instead of --jobs; every "
                             "node must see the trace (and --out) at the same path; the output is "
                             "the local run's (needs pip install 'kvtier[ray]')")


def add_policy_module_argument(parser) -> None:
    """``--policy-module``: modules that register eviction policies written in Python."""
    parser.add_argument("--policy-module", action="append", default=[], metavar="MODULE",
                        help="import MODULE (on the Python path) first, so the policies it "
                             "registers with kvtier.policy.sim.policies.register_policy can be "
                             "named (repeatable; see policy/README.md)")


def load_policy_modules(modules: list[str]) -> None:
    """Import the ``--policy-module``s; a module that cannot be imported is a one-line error."""
    from kvtier.policy.sim.policies import load_policy_modules as load

    try:
        load(modules)
    except ValueError as error:
        raise KvtierError(f"--policy-module: {error}") from None
