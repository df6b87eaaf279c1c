#!/usr/bin/env bash
# The GPU environment (requirements-gpu.txt): vLLM with the torch / transformers it pins.
#   bash scripts/gpu_env.sh check           resolver dry run (metadata only, no wheel is installed)
#   bash scripts/gpu_env.sh install [VENV]  create VENV (default .venv-gpu) and install into it
# Its requirements: requirements-gpu.txt + pyproject.toml's dependencies except torch, transformers
# and openhands-* (see requirements-gpu.txt for why). The resolver is uv, installed with pip into a
# scratch venv: pip's backtracking over this set takes more than half an hour, uv under a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
py=${SAO_PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" - "$tmp/requirements.in" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
drop = re.compile(r"^(torch|transformers|openhands-[a-z-]+)\b")
gpu = [l.strip() for l in open("requirements-gpu.txt") if l.strip() and not l.startswith("#")]
open(sys.argv[1], "w").write("\n".join([d for d in deps if not drop.match(d)] + gpu) + "\n")
PY

"$py" -m venv "$tmp/uv"
"$tmp/uv/bin/pip" install -q --disable-pip-version-check uv==0.13.9
"$tmp/uv/bin/uv" pip compile --quiet --no-header --python-version 3.12 \
    --python-platform x86_64-manylinux_2_28 --index-url https://pypi.org/simple \
    "$tmp/requirements.in" -o "$tmp/requirements.lock"
for pin in vllm==0.33.0 torch==2.14.0; do
    grep -q "^$pin\$" "$tmp/requirements.lock" || { echo "gpu_env: $pin not in the resolution" >&2; exit 1; }
done
grep -E '^(vllm|torch|transformers|ray|fastapi)==' "$tmp/requirements.lock" | sed 's/^/gpu_env: resolves /'

if [ "$mode" = install ]; then
    venv=${2:-.venv-gpu}
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -r "$tmp/requirements.lock"
    "$venv/bin/pip" install --no-deps -e .
    echo "gpu_env: $venv ready (engine.kind=vllm; the OpenHands agent is not in it)"
elif [ "$mode" != check ]; then
    echo "usage: bash scripts/gpu_env.sh [check | install [VENV]]" >&2; exit 2
fi
