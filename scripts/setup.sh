#!/usr/bin/env bash
# Create .venv with Python 3.12 and install the project (editable, dev extra).
# Idempotent: a stamp keyed on the hash of pyproject.toml makes a second run take seconds.
# After an install it runs `sao doctor` (a report; its exit code does not fail setup).
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
    if [ -n "${SAO_PYTHON:-}" ]; then echo "$SAO_PYTHON"; return; fi
    for cand in python3.12 python3.13; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2] in ((3,12),(3,13))' 2>/dev/null; then
            command -v "$cand"; return
        fi
    done
    local root="${PYENV_ROOT:-$HOME/.pyenv}"
    for dir in "$root"/versions/3.12* "$root"/versions/3.13*; do
        if [ -x "$dir/bin/python3" ]; then echo "$dir/bin/python3"; return; fi
    done
    return 1
}

hash=$(cat pyproject.toml | sha256sum | cut -c1-16)
stamp=.venv/.sao-setup-$hash
if [ -f "$stamp" ] && [ -x .venv/bin/python ]; then
    exit 0
fi

py=$(find_python) || {
    echo "setup: no Python 3.12 found (looked for python3.12 on PATH, then \$PYENV_ROOT/versions/3.12*); set SAO_PYTHON=/path/to/python3.12" >&2
    exit 1
}
echo "setup: using $py ($("$py" --version))"
if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# Saves ~6 s per litellm import (it otherwise retries a download of its cost map).
export LITELLM_LOCAL_MODEL_COST_MAP=True
start=$(date +%s)
.venv/bin/python -m pip install --progress-bar off -e '.[dev]'
echo "setup: installed in $(( $(date +%s) - start )) s"
rm -f .venv/.sao-setup-*
touch "$stamp"
# What a run still needs (Docker, images, ...): a report, never a failure of setup (`make docker` comes next).
.venv/bin/sao doctor || echo "setup: done; sao doctor lists what is still missing (above)"
