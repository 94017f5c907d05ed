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
# the versions these tests were run against (pinned: no resolver search, the same set each time)
"$VENV/bin/pip" install --quiet msgspec==0.23.0 PyYAML==6.0.4 pyzmq==27.3.0 \
    prometheus_client==0.26.0 sortedcontainers==2.4.0 psutil==7.2.2 py-cpuinfo==9.0.0 \
    aiofiles==25.1.0 aiofile==3.12.3 blake3==1.0.11 numpy==2.2.6 safetensors==0.8.0 \
    cachetools==8.0.2 httpx==0.28.1 fastapi==0.165.0 uvicorn==0.54.0 redis==8.1.0 numba==0.68.1 \
    aiohttp==3.14.5 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
    opentelemetry-exporter-prometheus==0.66b2 setuptools-scm==10.3.4 nvtx==0.2.17 \
    requests==2.34.2 cryptography==50.0.2
"$VENV/bin/lmcache" server --help >/dev/null
"$VENV/bin/python" -c "import lmcache; print('LMCache', getattr(lmcache, '__version__', '0.5.6'), 'CPU environment ready')"
echo "built $VENV in $(( $(date +%s) - started )) s"
