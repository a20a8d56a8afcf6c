#!/usr/bin/env bash
# Create (or refresh) the development environment in .venv: the package in
# editable mode with its test extra, and configurable-http-proxy from npm.
# Safe to run again: it only reinstalls when pyproject.toml or package.json changed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
fi

stamp="$venv/.gpupool-installed"
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$venv/bin/python" -m pip install -q -e ".[test]"
    echo "$want" > "$stamp"
fi

# configurable-http-proxy is a Node.js program JupyterHub needs; keep it
# inside the venv so that nothing global is touched.
if [ ! -x "$venv/node/node_modules/.bin/configurable-http-proxy" ]; then
    if command -v npm >/dev/null 2>&1; then
        npm install --silent --no-audit --no-fund --prefix "$venv/node" configurable-http-proxy@5 >/dev/null
    else
        echo "setup-env: npm not found; configurable-http-proxy not installed (hub tests will skip)" >&2
    fi
fi
