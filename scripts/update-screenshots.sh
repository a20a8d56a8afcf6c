#!/usr/bin/env bash
# Refresh the screenshots of the gpupool pages in docs/images/.
#
# The browser tests (tests/pages/test_pages_hub.py: a real hub, headless
# Chromium) save their screenshots in build/screenshots/pages/, which git
# ignores, so running the test suite never changes a tracked file. This script
# runs those tests and copies the pictures into docs/images/; commit them when
# they changed on purpose.
#
#   scripts/update-screenshots.sh            # run the browser tests, then copy
#   scripts/update-screenshots.sh --no-run   # only copy what the last run took
#
# PYTHON picks the interpreter (default .venv/bin/python, as scripts/test.sh sets up).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
shots=build/screenshots/pages

if [ "${1:-}" != "--no-run" ]; then
    if [ -d .venv/node/node_modules/.bin ]; then export PATH="$(pwd)/.venv/node/node_modules/.bin:$PATH"; fi
    "$python" -m pytest tests/pages/test_pages_hub.py -q
fi

for name in my-usage my-usage-phone admin-pool-map admin-grant; do
    if [ ! -f "$shots/$name.png" ]; then
        echo "missing $shots/$name.png: run without --no-run" >&2
        exit 1
    fi
    cp "$shots/$name.png" "docs/images/pages-$name.png"
    echo "docs/images/pages-$name.png"
done
