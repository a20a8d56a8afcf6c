#!/usr/bin/env bash
# Check the node agent against REAL NVML and a REAL PyTorch CUDA process.
#
#   scripts/agent-gpu-check.sh            # on a machine with an NVIDIA GPU
#
# Starts a small PyTorch process that holds GPU memory on cuda:0, then runs the
# agent's discovery (inventory, validated with the pool's own loader),
# attribution (the torch pid must appear on the GPU under this user, with
# memory), the metrics it would export, and one enforcement pass on that
# process (terminated when run as a normal user; refused when run as root,
# since root is never touched). Prints a JSON report and PASS, or FAIL with
# the reason; exits 0 only on PASS. Without a GPU it fails at once and says so.
#
# Run as root (the deployment case), it makes two throw-away system users
# (gpucheck-<pid>-a and -b), runs the CUDA process as the first and removes both
# on exit (a trap, whatever happens), so the enforcement pass really stops it.
# Then it runs the `gpu` tests (tests/agent/test_real_gpu.py) as those users: a
# busy process (matrix products) and one that only holds memory told apart
# within two polls, the memory guard stopping a process over its share and
# leaving one within it alone, and an MPS cap refusing an allocation where an
# MPS control daemon runs. The user names are the script's own, never input.
#
# Environment: PYTHON (interpreter with gpupool_hub; default .venv/bin/python,
# else python3), TORCH_PYTHON (interpreter with torch+CUDA; default $PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
TORCH_PYTHON="${TORCH_PYTHON:-$PYTHON}"

fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. Is there a GPU at all? (fail clearly, before anything else)
if ! nvml_out=$("$PYTHON" - 2>&1 <<'EOF'
import pynvml
pynvml.nvmlInit()
n = pynvml.nvmlDeviceGetCount()
print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, {n} GPU(s)")
pynvml.nvmlShutdown()
raise SystemExit(0 if n else 3)
EOF
); then
    fail "no usable NVIDIA GPU here (NVML says: ${nvml_out##*$'\n'}). This check needs a GPU node with the NVIDIA driver."
fi
echo "NVML: $nvml_out"

"$TORCH_PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || fail "PyTorch with CUDA is not available to $TORCH_PYTHON (set TORCH_PYTHON to an interpreter that has it)"

# 2. A real CUDA process: 256 MiB on cuda:0, kept until we are done; as root, as a throw-away user.
workdir=$(mktemp -d)
chmod 755 "$workdir"
torch_pid=""
check_users=()
cleanup() {
    if [[ -n "$torch_pid" ]] && kill -0 "$torch_pid" 2>/dev/null; then kill -9 "$torch_pid" 2>/dev/null || true; fi
    for u in "${check_users[@]}"; do
        pkill -KILL -u "$u" 2>/dev/null || true   # that user's processes only
        for _ in 1 2 3 4 5 6 7 8 9 10; do userdel "$u" 2>/dev/null && break; sleep 0.5; done
        if id "$u" >/dev/null 2>&1; then echo "WARNING: could not remove the throw-away user $u" >&2; fi
    done
    rm -rf "$workdir"
}
trap cleanup EXIT
run_as=()
if [[ $(id -u) -eq 0 ]]; then
    for suffix in a b; do
        u="gpucheck-$$-$suffix"
        useradd --system --no-create-home --shell /usr/sbin/nologin "$u" || fail "could not create the throw-away user $u"
        check_users+=("$u")
    done
    run_as=(setpriv --reuid="${check_users[0]}" --regid="$(id -g "${check_users[0]}")" --clear-groups)
    echo "throw-away users: ${check_users[*]} (removed on exit)"
fi
"${run_as[@]}" "$TORCH_PYTHON" -c '
import time, torch
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(300)
' >"$workdir/torch.out" 2>"$workdir/torch.err" &
torch_pid=$!
for _ in $(seq 1 120); do
    grep -q ready "$workdir/torch.out" 2>/dev/null && break
    kill -0 "$torch_pid" 2>/dev/null || fail "the PyTorch process died: $(tail -3 "$workdir/torch.err")"
    sleep 0.5
done
grep -q ready "$workdir/torch.out" || fail "the PyTorch process did not get a CUDA context within 60 s"
echo "PyTorch CUDA process: pid $torch_pid"

# 3. The agent's own code, once, against real NVML.
TORCH_PID="$torch_pid" CHECK_USER="${check_users[0]:-}" "$PYTHON" - <<'EOF'
import json, os, socket, sys, time

import pynvml

from gpupool_hub.agent.attribution import take_snapshot, user_name
from gpupool_hub.agent.enforce import KILLED, SKIPPED_ROOT, TERMINATED, Enforcer
from gpupool_hub.agent.metrics import AgentMetrics
from gpupool_hub.agent.nvml import discover, nvml_session
from gpupool_hub.placement.hardware import load_nodes
from prometheus_client import generate_latest

pid = int(os.environ["TORCH_PID"])
me = os.environ.get("CHECK_USER") or user_name(os.getuid())
problems = []
with nvml_session(pynvml):
    inventory, gpus = discover(pynvml, socket.gethostname().split(".")[0])
    load_nodes([inventory])  # the service's loader must accept it
    mine = []
    for _ in range(20):  # NVML lists a new context after a moment
        snap = take_snapshot(pynvml, gpus)
        mine = [p for p in snap.processes if p.pid == pid]
        if mine:
            break
        time.sleep(0.5)
    metrics = AgentMetrics(inventory["name"], metrics_min_uid=0)
    metrics.update(snap)
    exported = [line for line in generate_latest(metrics.registry).decode().splitlines()
                if line.startswith("gpupool_agent_user_gpu_active{") and f'user="{me}"' in line]
    if not mine:
        problems.append(f"pid {pid} (the torch process) is not among the GPU processes NVML lists "
                        f"(is the agent in the host pid namespace?)")
    for p in mine:
        if p.user != me:
            problems.append(f"pid {pid} attributed to {p.user!r}, expected {me!r}")
        if not p.memory_bytes:
            problems.append(f"pid {pid} shows no GPU memory on {p.gpu_uuid} (NVML may hide it from non-root)")
    if mine and not exported:
        problems.append(f"no gpupool_agent_user_gpu_active series for {me!r}")
    actions = Enforcer(min_uid=1, grace=10).enforce(snap, [me]) if mine else []
    # as a throw-away user (the script ran as root) the process is really stopped; root's never are
    expected = {SKIPPED_ROOT} if me == "root" else {TERMINATED, KILLED}
    if mine and not any(a.pid == pid and a.action in expected for a in actions):
        problems.append(f"enforcement on pid {pid} gave {[a.action for a in actions]}, expected one of {sorted(expected)}")

report = {
    "inventory": inventory,
    "torch_process": [p.as_dict() for p in mine],
    "all_gpu_processes": [p.as_dict() for p in snap.processes],
    "gpus": [vars(g) for g in snap.gpus],
    "exported": exported,
    "enforcement": [vars(a) for a in actions],
    "problems": problems,
}
print(json.dumps(report, indent=2, default=str))
if problems:
    print("FAIL: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"PASS: {len(gpus)} GPU(s) discovered, torch pid {pid} attributed to {me}, "
      f"enforcement {'refused (root)' if me == 'root' else 'stopped it'}")
EOF

# 4. The same checks as the `gpu` tests: busy vs. memory-holding, the guard's stop, an MPS cap.
gpu_env=(TORCH_PYTHON="$TORCH_PYTHON")
if [[ ${#check_users[@]} -eq 2 ]]; then gpu_env+=(GPUPOOL_GPU_CHECK_USERS="${check_users[0]},${check_users[1]}"); fi
env "${gpu_env[@]}" "$PYTHON" -m pytest -m gpu -q -rs -p no:cacheprovider tests/agent/test_real_gpu.py
