#!/usr/bin/env bash
# Build the side environment the vLLM tests use: the official vllm==0.33.0 wheel without its
# CUDA dependencies, beside (not inside) the project's virtualenv, reusing its CPU torch.
# Usage: tests/probes/vllm/side_env.sh [/path/to/main/.venv] [/tmp/kvt-vllm-side]
# Then: KVTIER_VLLM_PYTHON=/tmp/kvt-vllm-side/bin/python pytest tests/probes
set -euo pipefail
MAIN_VENV=${1:-.venv}
SIDE=${2:-/tmp/kvt-vllm-side}
MAIN_SITE=$("$MAIN_VENV/bin/python" -c "import site; print(site.getsitepackages()[0])")
"$MAIN_VENV/bin/python" -m venv "$SIDE"
# the main venv's packages (torch CPU, pyzmq, msgpack) come after the side's own
echo "$MAIN_SITE" > "$SIDE/lib/python3.11/site-packages/zz_main_venv.pth"
"$SIDE/bin/pip" install -q --no-deps vllm==0.33.0
# what `import vllm.distributed.kv_events` and the kv_offload managers ask for on CPU
"$SIDE/bin/pip" install -q msgspec cbor2 pydantic cachetools psutil regex blake3 transformers \
    openai-harmony pybase64 cloudpickle py-cpuinfo partial-json-parser aiohttp fastapi openai \
    pillow requests uvloop watchfiles xgrammar llguidance
"$SIDE/bin/python" -c "from vllm.distributed.kv_events import ZmqEventPublisher; print('vLLM side env ready')"
