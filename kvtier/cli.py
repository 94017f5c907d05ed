"""The ``kvtier`` command: one entry point, one verb per job.

Each verb is a small module in ``kvtier/verbs/`` with ``SUMMARY``, ``EXAMPLE``,
``add_arguments(parser)`` and ``run(args) -> int``. Verb modules import only the standard
library at module level; the heavy work (DuckDB, torch, scikit-learn, Streamlit) is imported
inside ``run`` so that ``kvtier --help`` starts fast.

Every failure ends as one line on stderr (``kvtier VERB: error: ...``) and an exit code
(:mod:`kvtier.errors`: 2 bad input, 1 runtime failure); ``--verbose`` adds the traceback. A
reader that closes the pipe early (``kvtier analyze ... | head``) ends the command quietly
with 141, as for a C tool killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from kvtier import __version__
from kvtier.errors import BAD_INPUT, explain

# verb -> module; the order is the order of --help.
VERBS: dict[str, str] = {
    "demo": "kvtier.verbs.demo",
    "collect": "kvtier.verbs.collect",
    "store": "kvtier.verbs.store",
    "analyze": "kvtier.verbs.analyze",
    "simulate": "kvtier.verbs.simulate",
    "calibrate": "kvtier.verbs.calibrate",
    "recommend": "kvtier.verbs.recommend",
    "evaluate": "kvtier.verbs.evaluate",
    "push": "kvtier.verbs.push",
    "probe": "kvtier.verbs.probe",
    "rollout": "kvtier.verbs.rollout",
    "guardrail": "kvtier.verbs.guardrail",
    "engine": "kvtier.verbs.engine",
    "dashboard": "kvtier.verbs.dashboard",
}
SIGPIPE_EXIT = 128 + 13


class Parser(argparse.ArgumentParser):
    """argparse with a short usage line on errors instead of every option."""

    def error(self, message: str):
        positionals = " ".join(a.metavar or a.dest for a in self._actions
                               if not a.option_strings and a.help != argparse.SUPPRESS)
        usage = f"usage: {self.prog} [options]{' ' + positionals if positionals else ''}"
        self.exit(BAD_INPUT, f"{usage}  ('{self.prog} --help' lists them)\n"
                             f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kvtier",
        description="Observe and tune tiered KV caches (GPU -> CPU -> cold) in LLM serving.",
        epilog="Run 'kvtier VERB --help' for a verb's options and an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvtier {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log progress details, and print the traceback of a failure")
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
        sub.set_defaults(_run=module.run, _flags=_flags_of(sub))
    return parser


def _flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> the long flag, for this parser and its sub-commands (``store info``...)."""
    flags = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in ("help",):
            flags[action.dest] = longs[0]
        for sub in getattr(action, "choices", None) or ():
            if isinstance(action.choices, dict):
                flags.update({k: v for k, v in _flags_of(action.choices[sub]).items() if k not in flags})
    return flags


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return BAD_INPUT
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # a closed pipe surfaces here, not at interpreter exit
        return code
    except BrokenPipeError:
        _silence_stdout()
        return SIGPIPE_EXIT
    except KeyboardInterrupt as stop:
        signum = getattr(stop, "signum", None)
        if signum:
            import signal

            return _fail(args, f"stopped by {signal.Signals(signum).name}", 128 + signum)
        return _fail(args, "interrupted", 130)
    except Exception as error:
        message, code = explain(error, args._flags)
        return _fail(args, message, code)


def _fail(args, message: str, code: int) -> int:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    print(f"kvtier {args.verb}: error: {message}", file=sys.stderr, flush=True)
    if args.verbose and sys.exc_info()[0] is not None:
        import traceback

        traceback.print_exc()
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
