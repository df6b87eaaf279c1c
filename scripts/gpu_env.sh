#!/usr/bin/env bash
# Resolver dry run of the `gpu` extra (vLLM, engine.kind=vllm): does `pip install -e '.[gpu]'` resolve
# for Python 3.12 on x86_64 Linux? Metadata only, no wheel is installed (under a minute). Prints the
# resolved vllm / torch / transformers / mcp / openhands-sdk. To install: pip install -e '.[gpu]'.
# The resolver is uv, installed by the Python's own pip into a scratch directory (a scratch venv only for a
# Python without pip: making one runs ensurepip, 4 s of CPU). pip's own dry run
# (`pip install --dry-run --ignore-installed -e '.[gpu]'`) resolves too, but downloads the wheels
# (vLLM, torch, the CUDA libraries: over a GB) to read their metadata; uv reads it without them.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${SAO_PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

pip=("$py" -m pip)
if ! "$py" -m pip --version >/dev/null 2>&1; then
    "$py" -m venv "$tmp/venv"
    pip=("$tmp/venv/bin/pip")
fi
"${pip[@]}" install -q --disable-pip-version-check --target "$tmp/uv" uv==0.13.9
echo "-e .[gpu]" > "$tmp/requirements.in"
"$tmp/uv/bin/uv" pip compile --quiet --no-header --python-version 3.12 \
    --python-platform x86_64-manylinux_2_28 --index-url https://pypi.org/simple \
    "$tmp/requirements.in" -o "$tmp/requirements.lock"
grep -E '^(vllm|torch|transformers|mcp|openhands-sdk)==' "$tmp/requirements.lock" | sed 's/^/gpu_env: resolves /'
