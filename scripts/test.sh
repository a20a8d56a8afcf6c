#!/usr/bin/env bash
# Run the whole test suite from a fresh clone: the system programs it uses
# (installed when run as root on Debian, else the command to install them is
# printed), then .venv, then pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k ledger).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/system-deps.sh
scripts/setup-env.sh
export PATH="$(pwd)/.venv/node/node_modules/.bin:$(pwd)/.venv/bin:$PATH"
exec .venv/bin/python -m pytest "$@"
