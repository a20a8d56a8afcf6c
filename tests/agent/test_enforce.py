"""Enforcement on real processes: who gets stopped, how, and who never does."""

from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import time
from dataclasses import replace

import pytest

from gpupool_hub.agent import enforce as enforce_module
from gpupool_hub.agent.attribution import take_snapshot
from gpupool_hub.agent.enforce import (
    KILLED, SKIPPED_CHANGED, SKIPPED_KERNEL, SKIPPED_ROOT, SKIPPED_SYSTEM, TERMINATED, WOULD_TERMINATE, Enforcer)
from gpupool_hub.agent.nvml import list_gpus, nvml_session
from gpupool_hub.agent.servers import ServerRecords
from tests.agent.conftest import alive, gpu


def snapshot(nv, records=None):
    with nvml_session(nv):
        return take_snapshot(nv, list_gpus(nv), servers=None if records is None else ServerRecords(str(records)))


def outcome(actions):
    return {a.pid: a.action for a in actions}


def wait_dead(*popens, timeout=5.0):
    """Reap the test's children (the agent signals them; we are their parent)."""
    for p in popens:
        p.wait(timeout)


def test_sigterm_then_sigkill_after_the_grace_only_for_named_users(procs, test_users, make_nvml):
    polite = procs.sleeper("gpupool-t1")
    stubborn = procs.sleeper("gpupool-t1", ignore_term=True)
    other = procs.sleeper("gpupool-t2")
    nv = make_nvml([gpu(0, processes=[{"pid": polite.pid}, {"pid": other.pid}]),
                    gpu(1, processes=[{"pid": stubborn.pid}, {"pid": polite.pid}])])
    enforcer = Enforcer(min_uid=min(test_users.values()), grace=1.0)
    started = time.monotonic()
    actions = enforcer.enforce(snapshot(nv), ["gpupool-t1"])
    assert outcome(actions) == {polite.pid: TERMINATED, stubborn.pid: KILLED}
    assert time.monotonic() - started >= 1.0  # the stubborn one got its full grace
    polite_action = next(a for a in actions if a.pid == polite.pid)
    assert set(polite_action.gpu_uuids) == {"GPU-0000-fake", "GPU-0001-fake"}  # one process, acted on once
    wait_dead(polite, stubborn)
    assert polite.returncode == -15 and stubborn.returncode == -9
    assert alive(other.pid)


def test_root_and_system_accounts_are_never_touched(procs, test_users, make_nvml):
    root = procs.sleeper(None)
    system = procs.sleeper("gpupool-t1")  # a system-range uid (< 1000)
    nv = make_nvml([gpu(0, processes=[{"pid": root.pid}, {"pid": system.pid}])])
    snap = snapshot(nv)
    actions = Enforcer(grace=0.5).enforce(snap, ["root", "gpupool-t1"])  # default min_uid=1000
    assert outcome(actions) == {root.pid: SKIPPED_ROOT, system.pid: SKIPPED_SYSTEM}
    # even with min_uid as low as it goes, root stays untouchable
    actions = Enforcer(min_uid=1, grace=0.5).enforce(snap, ["root"])
    assert outcome(actions) == {root.pid: SKIPPED_ROOT}
    assert alive(root.pid) and alive(system.pid)
    with pytest.raises(ValueError):
        Enforcer(min_uid=0)


def test_kernels_of_a_running_server_are_spared_unless_the_service_says_so(procs, test_users, make_nvml,
                                                                          server_records):
    server, kernel = procs.server_with_kernel("gpupool-t1", server_records)  # recorded by the spawner
    orphan = procs.orphan_kernel("gpupool-t1")
    script = procs.sleeper("gpupool-t1")
    nv = make_nvml([gpu(0, processes=[{"pid": kernel}, {"pid": orphan.pid}, {"pid": script.pid}])])
    enforcer = Enforcer(min_uid=min(test_users.values()), grace=2.0)

    actions = enforcer.enforce(snapshot(nv, server_records), ["gpupool-t1"])
    assert outcome(actions) == {kernel: SKIPPED_KERNEL, orphan.pid: TERMINATED, script.pid: TERMINATED}
    wait_dead(orphan, script)
    assert alive(kernel) and alive(server.pid)

    nv.table["gpus"][0]["processes"] = [{"pid": kernel}]
    actions = enforcer.enforce(snapshot(nv, server_records), ["gpupool-t1"], kernel_users=["gpupool-t1"])
    assert outcome(actions) == {kernel: TERMINATED}
    deadline = time.monotonic() + 5
    while alive(kernel) and time.monotonic() < deadline:  # the server (its parent) reaps it
        time.sleep(0.05)
    assert not alive(kernel) and alive(server.pid)  # the kernel, not the server


@pytest.mark.parametrize("program", ["jupyter-lab", "jupyterhub-singleuser"])
def test_a_job_under_a_program_named_like_a_server_is_stopped_unless_the_hub_recorded_it(
        procs, test_users, make_nvml, server_records, program):
    """Issue 37.7: the name of a kernel's parent is the user's to choose; only the pid the
    spawner recorded makes it a running server whose kernels the hub culls."""
    server, kernel = procs.server_with_kernel("gpupool-t1", server_records)
    impostor, job = procs.server_with_kernel("gpupool-t1", program=program)  # not recorded
    nv = make_nvml([gpu(0, processes=[{"pid": kernel}]), gpu(1, processes=[{"pid": job}])])
    actions = Enforcer(min_uid=min(test_users.values()), grace=2.0).enforce(
        snapshot(nv, server_records), ["gpupool-t1"])
    assert outcome(actions) == {kernel: SKIPPED_KERNEL, job: TERMINATED}
    wait_until_dead(job)  # its parent, the impostor, reaps it
    assert alive(kernel) and alive(server.pid) and alive(impostor.pid)  # only the GPU job was stopped


def test_a_record_the_server_no_longer_matches_is_not_trusted(procs, test_users, make_nvml, server_records):
    """A record names a pid and its start time: a pid reused by another process, a record in a
    directory others may write, or one another user wrote, make no process a server."""
    server, kernel = procs.server_with_kernel("gpupool-t1", server_records)
    record = server_records / f"{server.pid}.json"
    nv = make_nvml([gpu(0, processes=[{"pid": kernel}])])
    enforcer = Enforcer(min_uid=min(test_users.values()), grace=2.0, dry_run=True)

    def verdict() -> str:
        return outcome(enforcer.enforce(snapshot(nv, server_records), ["gpupool-t1"]))[kernel]

    assert verdict() == SKIPPED_KERNEL
    body = json.loads(record.read_text())
    record.write_text(json.dumps({**body, "started": body["started"] - 60}))  # as if the pid were reused
    assert verdict() == WOULD_TERMINATE
    record.write_text(json.dumps(body))
    server_records.chmod(0o777)  # anyone could have written it
    assert verdict() == WOULD_TERMINATE
    server_records.chmod(0o755)
    os.chown(record, test_users["gpupool-t1"], -1)  # the user wrote it
    assert verdict() == WOULD_TERMINATE
    os.chown(record, 0, -1)
    assert verdict() == SKIPPED_KERNEL


def wait_until_dead(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still runs"
        time.sleep(0.05)


def test_dry_run_only_logs(procs, test_users, make_nvml, caplog):
    p = procs.sleeper("gpupool-t1")
    nv = make_nvml([gpu(0, processes=[{"pid": p.pid}])])
    caplog.set_level(logging.WARNING, "gpupool.agent.enforce")
    enforcer = Enforcer(min_uid=100, grace=0.2, dry_run=True)
    assert outcome(enforcer.enforce(snapshot(nv), ["gpupool-t1"])) == {p.pid: WOULD_TERMINATE}
    # the service may ask for a dry run too, even of an enforcing agent
    live = Enforcer(min_uid=100, grace=0.2)
    assert outcome(live.enforce(snapshot(nv), ["gpupool-t1"], dry_run=True)) == {p.pid: WOULD_TERMINATE}
    assert alive(p.pid)
    assert f"DRY RUN: would stop process pid {p.pid} of gpupool-t1" in caplog.text


def test_a_reused_pid_is_left_alone(procs, test_users, make_nvml):
    p = procs.sleeper("gpupool-t1")
    snap = snapshot(make_nvml([gpu(0, processes=[{"pid": p.pid}])]))
    (proc,) = snap.processes
    snap.processes = [replace(proc, create_time=proc.create_time - 100)]  # "another process had this pid"
    assert outcome(Enforcer(min_uid=100, grace=0.2).enforce(snap, ["gpupool-t1"])) == {p.pid: SKIPPED_CHANGED}
    snap.processes = [replace(proc, uid=proc.uid + 1)]  # owner changed since the snapshot
    assert outcome(Enforcer(min_uid=100, grace=0.2).enforce(snap, ["gpupool-t1"])) == {p.pid: SKIPPED_CHANGED}
    assert alive(p.pid)


def test_empty_list_does_nothing(procs, make_nvml):
    p = procs.sleeper("gpupool-t1")
    assert Enforcer(min_uid=100).enforce(snapshot(make_nvml([gpu(0, processes=[{"pid": p.pid}])])), []) == []
    assert alive(p.pid)


def test_signals_go_by_pid_never_through_a_shell():
    tree = ast.parse(inspect.getsource(enforce_module))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"subprocess", "shlex", "pty"}
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not {c for c in calls if c.startswith(("os.system", "os.popen", "os.exec", "os.spawn"))}
