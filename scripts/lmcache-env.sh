#!/usr/bin/env bash
# Build the environment of the LMCache peer tests: LMCache 0.5.6 on the CPU (its multi-process
# cache server, bench client and cache simulator), beside kvtier's venv, independent of it.
#
# Usage: scripts/lmcache-env.sh VENV [PYTHON]     (make does: .venv-lmcache)
# `pip install lmcache` would resolve CUDA wheels, so: the CPU torch wheel first, LMCache
# itself --no-deps, then the packages its imports need on the CPU path (its CUDA ops are
# never loaded there).
set -euo pipefail
VENV=${1:?usage: scripts/lmcache-env.sh VENV [PYTHON]}
PYTHON=${2:-python3}
started=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet torch==2.13.0
"$VENV/bin/pip" install --quiet --no-deps lmcache==0.5.6
"$VENV/bin/pip" install --quiet msgspec pyyaml pyzmq prometheus_client sortedcontainers psutil \
    py-cpuinfo aiofiles aiofile blake3 "numpy<=2.2.6" safetensors cachetools httpx fastapi \
    uvicorn redis numba aiohttp opentelemetry-api opentelemetry-sdk \
    opentelemetry-exporter-prometheus setuptools_scm nvtx requests cryptography
"$VENV/bin/lmcache" server --help >/dev/null
"$VENV/bin/python" -c "import lmcache; print('LMCache', getattr(lmcache, '__version__', '0.5.6'), 'CPU environment ready')"
echo "built $VENV in $(( $(date +%s) - started )) s"
