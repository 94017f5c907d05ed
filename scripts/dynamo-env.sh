#!/usr/bin/env bash
# Build the environment of the Dynamo peer tests: NVIDIA Dynamo 1.6.1's mocker (a model-free
# engine that schedules, caches and publishes KV events as a real worker does) and frontend,
# beside kvtier's venv, independent of it. No GPU, no torch, no etcd or NATS (file discovery).
#
# Usage: scripts/dynamo-env.sh VENV [PYTHON]      (make does: .venv-dynamo)
# `pip install ai-dynamo==1.6.1` does not resolve (it pins a stub package), so both wheels are
# downloaded and installed --no-deps, then what the mocker and frontend import.
set -euo pipefail
VENV=${1:?usage: scripts/dynamo-env.sh VENV [PYTHON]}
PYTHON=${2:-python3}
started=$(date +%s)
"$PYTHON" -m venv "$VENV"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
"$VENV/bin/pip" download --quiet --no-deps --only-binary :all: --dest "$wheels" \
    ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
"$VENV/bin/pip" install --quiet --no-deps "$wheels"/*.whl
# the versions these tests were run against (pinned: no resolver search, the same set each time)
"$VENV/bin/pip" install --quiet aiohttp==3.14.5 msgspec==0.23.0 prometheus_client==0.26.0 \
    pyzmq==27.3.0 redis==8.1.0 tqdm==4.70.1 typing_extensions==4.16.0 zstandard==0.25.0 \
    pydantic==2.13.5 uvloop==0.23.0 PyYAML==6.0.4 packaging==26.4
"$VENV/bin/python" -c "import dynamo.mocker, dynamo.frontend; print('Dynamo 1.6.1 mocker environment ready')"
echo "built $VENV in $(( $(date +%s) - started )) s"
