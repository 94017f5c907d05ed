"""Command-line options the policy verbs share. Standard library only: this runs while
``kvtier --help`` builds its parser."""

TRACE_FORMATS = ("mooncake", "weka", "bailian", "store")  # policy.readers.FORMATS


def add_trace_arguments(parser) -> None:
    """``--format``, ``--block-tokens``, ``--skip-bad``, ``--weka-start-gap-s``, ``--model``."""
    parser.add_argument("--format", choices=TRACE_FORMATS, help="trace format (detected when omitted)")
    parser.add_argument("--block-tokens", type=int,
                        help="tokens per block id (default: the format's, e.g. 512 for Mooncake)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip and count bad trace lines instead of stopping at the first")
    parser.add_argument("--weka-start-gap-s", type=float, default=60.0,
                        help="WEKA: seconds between conversation starts (default 60)")
    parser.add_argument("--model",
                        help="KV geometry: needed for byte capacities (16GiB); costs use "
                             "llama-3.1-8b unless told")
