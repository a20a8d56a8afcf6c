"""Issue 27.10: the Slurm commands pass the username as one argument, never split.

batchspawner fills the username into ``sudo -E -u {username}`` and joins the
commands into one string; split afterwards, "x -u root" became ``sudo -E -u x
-u root sbatch`` and "o'neil" an unbalanced quote. Here the real submit, query
and cancel paths run a recorder in place of sudo (the recorder writes the argv
it got and answers like sbatch / squeue), so what is checked is the argv a
process really receives.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpupool_hub.spawner.errors import GPUPoolRefused
from gpupool_hub.spawner.slurm import GPUPoolSlurmSpawner, command_argv

NAMES = ["x -u root", "o'neil", "alice -- sh -s", 'b"ob', "carol;id", "{job_id}"]

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


@pytest.mark.parametrize("name", NAMES)
def test_the_username_is_one_argument_of_sbatch_squeue_and_scancel(tmp_path, name):
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
