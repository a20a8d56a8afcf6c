#!/usr/bin/env bash
# Refresh the screenshots in docs/images/ from the ones the browser tests take.
#
# The browser tests (tests/labext/test_browser.py, tests/labext/test_save_browser.py,
# tests/e2e/test_widget_hub.py (the widget, and the spawn page's class words),
# tests/pages/test_pages_hub.py where present, tests/pages/test_pool_map_large.py,
# tests/spawner/test_wait_range_browser.py, tests/e2e/test_spawn_page_browser.py (the spawn page:
# normal, full, refused, after a floor stop), tests/pages/test_pages_notices.py,
# tests/e2e/test_wait_closed_tab.py: the demo's waiting progress page, home page and pool map) save their screenshots under
# build/screenshots/, which git ignores, so running the test suite never
# changes a tracked file. This script runs those tests and copies every PNG
# found under build/screenshots/ into docs/images/; a PNG in a subfolder gets
# the folder in its name (build/screenshots/pages/my-usage.png becomes
# docs/images/pages-my-usage.png). Commit the pictures when they changed on
# purpose.
#
#   scripts/update-screenshots.sh            # run the browser tests, then copy
#   scripts/update-screenshots.sh --no-run   # only copy what the last run took
#
# PYTHON picks the interpreter (default .venv/bin/python, as scripts/test.sh sets up);
# SCREENSHOTS and DOCS_IMAGES change the folders (the script's own test uses them).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
shots=${SCREENSHOTS:-build/screenshots}
images=${DOCS_IMAGES:-docs/images}

if [ "${1:-}" != "--no-run" ]; then
    if [ -d .venv/node/node_modules/.bin ]; then export PATH="$(pwd)/.venv/node/node_modules/.bin:$PATH"; fi
    tests=(tests/labext/test_browser.py tests/labext/test_save_browser.py tests/e2e/test_widget_hub.py
           tests/agent/test_gpu_use_pages.py tests/pages/test_pool_map_large.py
           tests/spawner/test_wait_range_browser.py tests/e2e/test_spawn_page_browser.py
           tests/pages/test_pages_notices.py tests/e2e/test_wait_closed_tab.py)
    if [ -f tests/pages/test_pages_hub.py ]; then tests+=(tests/pages/test_pages_hub.py); fi
    "$python" -m pytest "${tests[@]}" -q
fi

if [ ! -d "$shots" ]; then
    echo "no $shots: run without --no-run" >&2
    exit 1
fi
mkdir -p "$images"
copied=0
while IFS= read -r -d '' png; do
    relative=${png#"$shots"/}
    target="$images/${relative//\//-}"
    cp "$png" "$target"
    echo "$target"
    copied=$((copied + 1))
done < <(find "$shots" -type f -name '*.png' -print0 | sort -z)
if [ "$copied" -eq 0 ]; then
    echo "no PNG under $shots: run without --no-run" >&2
    exit 1
fi
