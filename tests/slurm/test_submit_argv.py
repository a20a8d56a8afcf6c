"""Issue 27.10 and 37.1: what reaches the Slurm commands in place of ``{username}``.

batchspawner fills the username into ``sudo -E -u {username}`` and joins the
commands into one string; split afterwards, "x -u root" became ``sudo -E -u x
-u root sbatch`` and "o'neil" an unbalanced quote. Here the real submit, query
and cancel paths run a recorder in place of sudo (the recorder writes the argv
it got and answers like sbatch / squeue), so what is checked is the argv a
process really receives.

One argument was not enough (issue 37.1): ``sudo -u '#0'`` runs as uid 0. The
spawn-level refusal of such names is tested against the real cluster in
``test_spawner_hub.py``; here ``command_argv``'s own guard: no value starting
with ``#`` or ``-`` fills a placeholder.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import sys
import textwrap
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpupool_hub.spawner.errors import GPUPoolRefused, SpawnFailure
from gpupool_hub.engines.slurm.spawner import GPUPoolSlurmSpawner, command_argv

#: a name with a real account wherever the tests run: the runner's own
OWN_ACCOUNT = pwd.getpwuid(os.getuid()).pw_name

RECORDER = textwrap.dedent("""
    import json, sys
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps(sys.argv[2:]) + "\\n")
    print("RUNNING gpu-a None" if "squeue" in sys.argv else "4242")
""")


def spawner(tmp_path, name: str) -> tuple[GPUPoolSlurmSpawner, object]:
    recorder = tmp_path / "recorder.py"
    recorder.write_text(RECORDER)
    calls = tmp_path / "calls.jsonl"
    c = Config()
    c.GPUPoolSlurmSpawner.exec_prefix = f"{sys.executable} {recorder} {calls} sudo -E -u {{username}}"
    c.GPUPoolSlurmSpawner.req_homedir = str(tmp_path)
    c.GPUPoolSlurmSpawner.cmd = ["jupyterhub-singleuser"]
    user = SimpleNamespace(name=name, groups=[], url=f"/user/{name}/", escaped_name=name, id=1)
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", url="http://127.0.0.1:8081/hub/",
                          public_host="", host="")
    s = GPUPoolSlurmSpawner(user=user, hub=hub, config=c)
    s.slurm_env = {}
    return s, calls


def test_the_username_is_one_argument_of_sbatch_squeue_and_scancel(tmp_path):
    name = OWN_ACCOUNT
    s, calls = spawner(tmp_path, name)

    async def walk():
        assert await s.submit_batch_script() == "4242"
        status = await s.query_job_status()
        await s.cancel_batch_job()
        return status

    status = asyncio.run(walk())
    assert status.name == "RUNNING"
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert argvs == [
        ["sudo", "-E", "-u", name, "sbatch", "--parsable"],
        ["sudo", "-E", "-u", name, "squeue", "-h", "-j", "4242", "-o", "%T %B %r"],
        ["sudo", "-E", "-u", name, "scancel", "4242"],
    ]


@pytest.mark.parametrize("template, values, argv", [
    ("sudo -E -u {username}", {"username": "x -u root"}, ["sudo", "-E", "-u", "x -u root"]),
    ("sudo -u {{username}} --", {"username": "o'neil"}, ["sudo", "-u", "o'neil", "--"]),
    ("runuser --user={username} -- sbatch", {"username": "a b"}, ["runuser", "--user=a b", "--", "sbatch"]),
    ("", {"username": "x"}, []),
])
def test_command_argv_fills_each_word_after_splitting(template, values, argv):
    assert command_argv(template, values) == argv


@pytest.mark.parametrize("template, message", [
    ("sudo -u '{username}", "cannot be split into words"),
    ("sudo -u {user name}", "a placeholder must be one word"),
])
def test_a_template_that_cannot_work_is_a_clear_config_error(template, message):
    with pytest.raises(GPUPoolRefused) as e:
        command_argv(template, {"username": "x"})
    assert message in e.value.message


@pytest.mark.parametrize("template, values", [
    ("sudo -E -u {username}", {"username": "#0"}),
    ("sudo -E -u {{username}}", {"username": "#1001"}),
    ("runuser -u {username} -- sbatch", {"username": "-u"}),
    ("sudo -u{username}", {"username": "#0"}),  # glued to its option: still the uid
    ("squeue -h -j {job_id}", {"username": "alice", "job_id": "--me"}),
])
def test_command_argv_refuses_a_value_read_as_a_uid_or_an_option(template, values):
    with pytest.raises(GPUPoolRefused) as e:
        command_argv(template, values)
    assert e.value.status_code == 403 and e.value.reason == SpawnFailure.UNIX_NAME
    assert "starting with '#' or '-'" in e.value.message, e.value.message


def test_command_argv_ignores_an_unsafe_value_the_template_does_not_use():
    """An admin's ``req_options = "--exclusive"`` is no placeholder of ``exec_prefix``."""
    assert command_argv("sudo -E -u {username}", {"username": "alice", "options": "--exclusive"}) == \
        ["sudo", "-E", "-u", "alice"]
