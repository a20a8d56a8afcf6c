"""GPUPoolSpawner without a hub: profile validation, user options, fail-closed/-open, KubeSpawner manifests."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from tornado import web
from traitlets import TraitError
from traitlets.config import Config

from gpupool_hub.engines.local.spawner import GPUPoolLocalProcessSpawner, GPUPoolSimpleSpawner
from gpupool_hub.spawner import (
    GPUPoolRefused,
    gpupool_options_from_form,
    parse_profiles,
)
from gpupool_hub.identity.spawner_token import SpawnerTokenError, spawner_token_from_config
from tests.fixtures.ports import free_port

PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "cpu": 2, "memory": "4G", "default": True},
    {"slug": "2x3090", "display_name": "2x 3090", "gpus": 2, "models": ["RTX 3090"]},
    {"slug": "quarter", "display_name": "1/4", "gpu_fraction": 0.25},
]


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/services/gpupool/api/v1"


def make(cls=GPUPoolSimpleSpawner, profiles=PROFILES, pool=None, **traits):
    """A spawner without a hub: ``traits`` for c.GPUPoolSpawner, ``pool`` for c.GPUPool."""
    c = Config()
    c.GPUPoolSpawner.profiles = profiles
    for k, v in (pool or {}).items():
        setattr(c.GPUPool, k, v)
    for k, v in traits.items():
        setattr(c.GPUPoolSpawner, k, v)
    user = SimpleNamespace(name="alice", groups=[], url="/user/alice/", escaped_name="alice", id=1)
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", url="http://127.0.0.1:8081/hub/",
                          public_host="", host="")
    return cls(user=user, hub=hub, config=c)


# ---------------------------------------------------------------- profiles


@pytest.mark.parametrize(
    "profiles, needle",
    [
        ([{"display_name": "x"}], "c.GPUPoolSpawner.profiles[0]: 'slug' must be"),
        ([{"slug": "a", "gpu": 1}], "c.GPUPoolSpawner.profiles[0] ('a'): unknown key(s) ['gpu']"),
        ([{"slug": "a", "gpus": -1}], "('a'): 'gpus' must be between 0 and 16, got -1"),
        ([{"slug": "a", "gpus": 100}], "'gpus' must be between 0 and 16, got 100"),
        ([{"slug": "a", "gpus": "2"}], "'gpus' must be a whole number"),
        ([{"slug": "a", "gpu_fraction": 1.5}], "'gpu_fraction' must be between 0 and 1"),
        ([{"slug": "a", "gpus": 1, "gpu_fraction": 0.5}], "either 'gpus' or 'gpu_fraction'"),
        ([{"slug": "a", "gpus": 1, "models": "RTX 3090 "}, {"slug": "b", "models": ["x"]}], "[1] ('b'): 'models' needs"),
        ([{"slug": "a", "gpus": 1, "models": [3090]}], "'models' must be a list"),
        ([{"slug": "a", "cpu": -1}], "'cpu' must be a number of cores"),
        ([{"slug": "a", "memory": "lots"}], "('a'): 'memory': memory must be bytes"),
        ([{"slug": "a", "gpus": 2, "max_gpus": 1}], "'max_gpus' (1) must be at least 'gpus' (2)"),
        ([{"slug": "a"}, {"slug": "a"}], "c.GPUPoolSpawner.profiles[1]: slug 'a' is already used by entry [0]"),
        ([{"slug": "a", "default": True}, {"slug": "b", "default": True}], "only one profile may be the default"),
        ([{"slug": "a", "spawner_override": []}], "'spawner_override' must be a dict"),
    ],
)
def test_bad_profiles_are_refused_naming_the_key(profiles, needle):
    with pytest.raises(TraitError) as e:
        parse_profiles(profiles)
    assert needle in str(e.value)
    with pytest.raises(TraitError) as e:  # and the configured spawner refuses to exist
        make(profiles=profiles)
    assert needle in str(e.value)


def test_profiles_parse_into_requests():
    with pytest.raises(TraitError, match="must be a list of profile dicts"):
        parse_profiles("cpu")
    cpu, two, quarter = parse_profiles(PROFILES)
    assert not cpu.needs_gpu and cpu.memory == 4 * 2**30 and cpu.default
    assert two.request() == {"gpus": 2, "models": ["RTX 3090"]}
    assert quarter.request() == {"gpu_fraction": "0.25", "share": "timeslice"}  # its guarantee class (issue 23)
    assert parse_profiles([{"slug": "m", "memory": "512Mi", "cpu": 0.5}])[0].request() == {
        "gpus": 0, "cpu_milli": 500, "memory_mib": 512}


def test_user_options_select_a_profile():
    s = make()
    assert s.select_profile({})[0].slug == "cpu"  # the default profile
    assert s.select_profile({"profile": "2x3090"})[0].slug == "2x3090"
    with pytest.raises(web.HTTPError) as e:
        s.select_profile({"profile": "nope"})
    assert e.value.status_code == 400
    assert e.value.log_message % e.value.args == (
        "Invalid user options: unknown profile 'nope'; choose one of ['cpu', '2x3090', 'quarter']")


def test_form_data_becomes_user_options():
    assert gpupool_options_from_form({"profile": ["a6000"], "gpus--a6000": ["3"]}) == {"profile": "a6000", "gpus": 3}
    assert gpupool_options_from_form({"profile": ["a6000"], "gpus--a6000": ["-3"]}) == {"profile": "a6000", "gpus": "-3"}
    assert gpupool_options_from_form({"profile": ["x"], "gpus--a6000": ["3"]}) == {"profile": "x"}
    assert make().options_from_query({"profile": "cpu"}) == {"profile": "cpu"}  # free: a link may start it


def test_a_link_to_a_paid_profile_shows_the_form_with_it_chosen_instead_of_starting():
    from gpupool_hub.spawner.form import render_form
    from gpupool_hub.spawner.logs import is_normal_refusal

    s = make(profiles=PROFILES + [{"slug": "a6000", "display_name": "A6000", "gpus": 1, "max_gpus": 4}])
    with pytest.raises(web.HTTPError) as e:  # JupyterHub renders the form (status 200) instead
        s.options_from_query({"profile": ["a6000"], "gpus--a6000": ["3"]})
    assert e.value.status_code == 200 and is_normal_refusal(e.value)
    page = render_form(s, None, None, s._gpupool_form_choice)
    assert 'value="a6000" checked' in page and '<option value="3" selected>' in page
    assert "Confirm the start.</strong> A6000 costs tokens, so a link does not start it." in page
    assert "Confirm the start" not in render_form(s, None, None)  # the form without a link
    with pytest.raises(web.HTTPError) as e:  # an unknown profile: the form with the error, nothing started
        s.options_from_query({"profile": ["nope"]})
    assert e.value.status_code == 400 and "unknown profile 'nope'" in str(e.value)


def test_api_url_comes_from_the_services_entry_the_token_never(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPOOL_API_TOKEN", "from-env")  # the service's hub token (the example's variable)
    monkeypatch.delenv("GPUPOOL_API_URL", raising=False)
    c = Config()
    c.JupyterHub.base_url = "/jh/"
    c.JupyterHub.services = [{"name": "gpupool", "url": "http://10.0.0.5:10101", "api_token": "s3cret-hub-token"}]
    s = GPUPoolLocalProcessSpawner(config=c, user=SimpleNamespace(name="a"))
    assert s.gpupool_api_url == "http://10.0.0.5:10101/jh/services/gpupool/api/v1"
    assert s.gpupool_server_api_url == s.gpupool_api_url
    # the service's hub token is not the spawner's: with no spawner token set, none
    assert s.gpupool_api_token == ""
    c.GPUPoolService.spawner_token = "the-spawners-own-secret"
    assert GPUPoolLocalProcessSpawner(config=c).gpupool_api_token == "the-spawners-own-secret"
    monkeypatch.setenv("GPUPOOL_API_URL", "http://elsewhere/api/v1")
    bare = GPUPoolLocalProcessSpawner(config=Config(), user=SimpleNamespace(name="a"))
    assert bare.gpupool_api_url == "http://elsewhere/api/v1" and bare.gpupool_api_token == ""
    monkeypatch.delenv("GPUPOOL_API_URL")
    assert GPUPoolLocalProcessSpawner(config=Config()).gpupool_api_url == "http://127.0.0.1:10101/services/gpupool/api/v1"


def test_the_spawner_and_the_service_share_one_secret_file(tmp_path):
    """The file is made once (0600) by whoever reads it first; the other reads the same secret."""
    c = Config()
    c.GPUPoolService.spawner_token_file = str(tmp_path / "gpupool_spawner_token")
    token = GPUPoolLocalProcessSpawner(config=c).gpupool_api_token
    assert len(token) == 64 and (tmp_path / "gpupool_spawner_token").stat().st_mode & 0o777 == 0o600
    assert spawner_token_from_config(c) == token
    (tmp_path / "gpupool_spawner_token").chmod(0o644)
    with pytest.raises(SpawnerTokenError, match="chmod 600"):
        spawner_token_from_config(c)
    (tmp_path / "gpupool_spawner_token").chmod(0o600)
    (tmp_path / "gpupool_spawner_token").write_text("short\n")
    with pytest.raises(SpawnerTokenError, match="no secret of at least 16"):
        spawner_token_from_config(c)


# ------------------------------------------------------- service unreachable


def test_gpu_profile_fails_closed_when_the_service_is_unreachable():
    s = make(gpupool_api_url=dead_url(), request_timeout=2)
    s.user_options = {"profile": "2x3090"}
    with pytest.raises(GPUPoolRefused) as e:
        asyncio.run(s.gpupool_prepare())
    assert e.value.status_code == 503 and e.value.reason == "gpupool_unreachable"
    assert "GPU pool service is not reachable" in e.value.jupyterhub_message
    assert s.gpupool_allocation_id is None


def test_cpu_only_profile_fails_open_unless_configured_otherwise():
    s = make(gpupool_api_url=dead_url(), request_timeout=2)
    s.user_options = {"profile": "cpu"}
    asyncio.run(s.gpupool_prepare())
    env = s.get_env()
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["CPU_LIMIT"] == "2.0"
    strict = make(gpupool_api_url=dead_url(), request_timeout=2, cpu_only_fail_open=False)
    strict.user_options = {"profile": "cpu"}
    with pytest.raises(GPUPoolRefused) as e:
        asyncio.run(strict.gpupool_prepare())
    assert "not reachable" in e.value.jupyterhub_message


def test_allocation_id_survives_clear_state_until_released():
    s = make(gpupool_api_url=dead_url(), request_timeout=2)
    s.load_state({"gpupool_allocation": "abc"})
    s.clear_state()  # JupyterHub does this before every start
    assert s.get_state()["gpupool_allocation"] == "abc"
    assert asyncio.run(s.gpupool_release("test")) is False  # unreachable: kept for the next try
    assert s.gpupool_allocation_id == "abc"


# --------------------------------------------------------------- KubeSpawner


@pytest.fixture
def kube(monkeypatch):
    kubespawner = pytest.importorskip("kubespawner.spawner")
    # no cluster here: get_pod_manifest never talks to the API server, so skip loading its config
    monkeypatch.setattr(kubespawner, "load_config", lambda **kwargs: None)
    from gpupool_hub.engines.kubernetes.spawner import GPUPoolKubeSpawner

    def build(**traits):
        c = Config()
        c.GPUPoolSpawner.profiles = PROFILES
        for k, v in traits.items():
            setattr(c.GPUPoolKubeSpawner, k, v)
        return GPUPoolKubeSpawner(_mock=True, config=c)

    return build


ALLOC = {"id": "a1", "node": "gpu-node-7", "description": "gpu-node-7, GPUs 0+3",
         "gpus": [{"index": 0, "uuid": "GPU-0", "model": "RTX 3090", "fraction": "1.000"},
                  {"index": 3, "uuid": "GPU-3", "model": "RTX 3090", "fraction": "1.000"}]}


def _required_terms(pod):
    """The node-selector terms as they are sent to the API server (JSON)."""
    from kubernetes_asyncio.client import ApiClient

    spec = ApiClient().sanitize_for_serialization(pod)["spec"]
    return spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


async def test_kube_pod_is_pinned_to_the_chosen_node_with_the_gpu_limit(kube):
    s = kube(node_affinity_required=[{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}])
    s.gpupool_profile = s.gpupool_profiles[1]
    s.apply_gpupool_allocation(ALLOC)
    pod = await s.get_pod_manifest()
    [term] = _required_terms(pod)  # the node is ANDed into the admin's term, not ORed beside it
    exprs = {(e["key"], e["operator"], tuple(e.get("values", ()))) for e in term["matchExpressions"]}
    assert ("kubernetes.io/hostname", "In", ("gpu-node-7",)) in exprs and ("gpu", "Exists", ()) in exprs
    limits = pod.spec.containers[0].resources.limits
    assert limits["nvidia.com/gpu"] == "2"
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["GPUPOOL_ALLOCATION"] == "a1" and "CUDA_VISIBLE_DEVICES" not in env
    # a restart with a CPU-only profile drops the pin and the limit
    s.apply_gpupool_allocation(None)
    pod = await s.get_pod_manifest()
    assert "nvidia.com/gpu" not in (pod.spec.containers[0].resources.limits or {})
    assert {e.name: e.value for e in pod.spec.containers[0].env}["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert [e["key"] for e in _required_terms(pod)[0]["matchExpressions"]] == ["gpu"]


async def test_kube_fractions_map_to_time_slices_or_mig(kube):
    frac = dict(ALLOC, gpus=[{"index": 1, "uuid": "GPU-1", "model": "A100", "fraction": "0.500"}])
    s = kube(gpupool_node_label="gpupool.io/node")
    s.apply_gpupool_allocation(dict(frac, gpus=[dict(frac["gpus"][0], fraction="0.250")]))
    pod = await s.get_pod_manifest()
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu.shared"] == "1"
    assert _required_terms(pod)[0]["matchExpressions"][0]["key"] == "gpupool.io/node"
    mig = kube(gpu_fraction_resources={"0.5": {"nvidia.com/mig-3g.40gb": 1}})
    mig.apply_gpupool_allocation(frac)
    pod = await mig.get_pod_manifest()
    assert pod.spec.containers[0].resources.limits["nvidia.com/mig-3g.40gb"] == "1"
    assert "nvidia.com/gpu" not in pod.spec.containers[0].resources.limits


async def test_kube_uses_gpupool_profiles_not_profile_list(kube):
    s = kube()
    assert callable(s.options_form)
    s.user_options = {"profile": "2x3090"}
    await s.load_user_options()  # KubeSpawner's own profile_list check must not reject our slugs


async def test_kube_restart_starts_again_from_the_admins_settings(kube):
    """Profile and allocation settings are two override layers; a restart undoes both, in order."""
    s = kube(extra_resource_limits={"admin.io/x": "1"}, profiles=[
        {"slug": "gpu", "gpus": 1,
         "spawner_override": {"extra_resource_limits": {"profile.io/y": "2"}, "image": "gpu-image"}},
        {"slug": "cpu", "default": True},
    ])
    configured_image = s.image
    gpu, cpu = s.gpupool_profiles
    s.apply_gpupool_profile(gpu)
    s.apply_gpupool_allocation(dict(ALLOC, gpus=ALLOC["gpus"][:1]))
    assert s.extra_resource_limits == {"profile.io/y": "2", "nvidia.com/gpu": "1"} and s.image == "gpu-image"
    assert s.node_affinity_required[0]["matchExpressions"][0]["values"] == ["gpu-node-7"]
    s.apply_gpupool_profile(cpu)
    s.apply_gpupool_allocation(None)
    assert s.extra_resource_limits == {"admin.io/x": "1"} and s.image == configured_image
    assert s.node_affinity_required == []


def test_profile_overrides_are_undone_by_the_next_profile():
    s = make(profiles=PROFILES + [{"slug": "big", "gpus": 1, "spawner_override": {"cmd": ["big-server"]}}])
    configured_cmd = list(s.cmd)
    s.apply_gpupool_profile(s.gpupool_profiles[-1])
    assert s.cmd == ["big-server"] and s.cpu_limit is None
    s.apply_gpupool_profile(s.gpupool_profiles[0])
    assert s.cmd == configured_cmd and s.cpu_limit == 2.0 and s.mem_limit == 4 * 2**30
    s.apply_gpupool_profile(None)
    assert s.cpu_limit is None and s.mem_limit is None
    with pytest.raises(GPUPoolRefused) as e:  # a trait this spawner class does not have
        make(profiles=[{"slug": "k", "spawner_override": {"image": "x"}}]).apply_gpupool_profile(
            parse_profiles([{"slug": "k", "spawner_override": {"image": "x"}}])[0])
    assert e.value.status_code == 500 and "overrides 'image'" in e.value.message


# ---------------------------------------------------------------- stopping


@pytest.mark.parametrize("cls", [GPUPoolSimpleSpawner, GPUPoolLocalProcessSpawner])
def test_a_stopping_server_is_seen_gone_at_once_so_its_gpus_go_back_at_once(cls, monkeypatch):
    """JupyterHub's own wait looks at a stopping server up to 5 s apart (exponential backoff with
    jitter): the GPUs stayed held, charged and out of the queue's reach that long after the exit."""
    spawner = make(cls)
    clock = {"now": 0.0}
    exits_at = 8.0  # a server that takes 8 s to stop (kernels, extensions)
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds, *args, **kwargs):
        clock["now"] += seconds
        await real_sleep(0)

    async def poll():
        return 0 if clock["now"] >= exits_at else None

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    spawner.poll = poll
    assert asyncio.run(spawner.wait_for_death(timeout=30)) is True
    assert clock["now"] - exits_at <= 0.1, f"seen gone {clock['now'] - exits_at:.2f} s after it exited"


def test_servers_are_told_where_their_pending_stop_is_written():
    s = GPUPoolLocalProcessSpawner(config=Config(), user=SimpleNamespace(name="a"),
                                   orm_spawner=SimpleNamespace(name="big gpu", server=None))  # a named server
    s.apply_gpupool_allocation(ALLOC)
    assert s._gpupool_env["GPUPOOL_NOTICE_FILE"] == "~/.gpupool/notice-big%20gpu.json"
    c = Config()
    c.GPUPoolSpawner.notice_file = ""  # turned off: no variable
    off = GPUPoolLocalProcessSpawner(config=c, user=SimpleNamespace(name="a"))
    off.apply_gpupool_allocation(ALLOC)
    assert "GPUPOOL_NOTICE_FILE" not in off._gpupool_env


async def test_kube_pods_are_told_where_their_pending_stop_is_written(kube):
    s = kube()
    s.apply_gpupool_allocation(ALLOC)
    env = {e.name: e.value for e in (await s.get_pod_manifest()).spec.containers[0].env}
    assert env["GPUPOOL_NOTICE_FILE"] == "~/.gpupool/notice-default.json"
