#!/usr/bin/env bash
# Run the whole test suite from a fresh clone: the system programs it uses
# (installed when run as root on Debian, else the command to install them is
# printed), then .venv, then pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k ledger).
# The tests run on pytest-xdist workers, one per CPU by default; set
# GPUPOOL_TEST_WORKERS=N for N of them, or 0 to run in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/system-deps.sh
scripts/setup-env.sh
export PATH="$(pwd)/.venv/node/node_modules/.bin:$(pwd)/.venv/bin:$PATH"
workers=${GPUPOOL_TEST_WORKERS:-auto}
case "$workers" in
    auto | [0-9] | [0-9][0-9]) ;;
    *) echo "GPUPOOL_TEST_WORKERS=$workers: expected a number of pytest workers (0 for none) or auto" >&2; exit 2 ;;
esac
exec .venv/bin/python -m pytest -n "$workers" "$@"
