"""The ``kvtier`` command: one entry point, one verb per job.

Each verb is a small module in ``kvtier/verbs/`` with ``SUMMARY``, ``EXAMPLE``,
``add_arguments(parser)`` and ``run(args) -> int``. Verb modules import only the standard
library at module level; the heavy work (DuckDB, torch, scikit-learn, Streamlit) is imported
inside ``run`` so that ``kvtier --help`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from kvtier import __version__
from kvtier.errors import KvtierError

# verb -> module; the order is the order of --help.
VERBS: dict[str, str] = {
    "demo": "kvtier.verbs.demo",
    "collect": "kvtier.verbs.collect",
    "store": "kvtier.verbs.store",
    "analyze": "kvtier.verbs.analyze",
    "simulate": "kvtier.verbs.simulate",
    "recommend": "kvtier.verbs.recommend",
    "evaluate": "kvtier.verbs.evaluate",
    "push": "kvtier.verbs.push",
    "probe": "kvtier.verbs.probe",
    "rollout": "kvtier.verbs.rollout",
    "engine": "kvtier.verbs.engine",
    "dashboard": "kvtier.verbs.dashboard",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvtier",
        description="Observe and tune tiered KV caches (GPU -> CPU -> cold) in LLM serving.",
        epilog="Run 'kvtier VERB --help' for a verb's options and an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvtier {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    for name, module_name in VERBS.items():
        module = importlib.import_module(module_name)
        sub = verbs.add_parser(
            name,
            help=module.SUMMARY,
            description=module.SUMMARY,
            epilog=f"example:\n  {module.EXAMPLE}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args._run(args) or 0)
    except KvtierError as error:
        return _fail(args.verb, str(error), getattr(error, "exit_code", 2))
    except FileNotFoundError as error:
        return _fail(args.verb, f"no such file: {error.filename or error}", 2)
    except ValueError as error:  # configuration validation names the bad value
        return _fail(args.verb, str(error), 2)
    except KeyboardInterrupt:
        return _fail(args.verb, "interrupted", 130)


def _fail(verb: str, message: str, code: int) -> int:
    print(f"kvtier {verb}: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
