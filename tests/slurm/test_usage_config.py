"""The service's usage settings: the 'slurm' preset is built from c.GPUPool, bad combinations stop it at start-up."""

from __future__ import annotations

import shutil
import textwrap
from decimal import Decimal

import pytest

from gpupool_hub.service.app import GPUPoolService
from gpupool_hub.usage.own_records import AllocationRecordsSource
from gpupool_hub.engines.slurm.accounting import SlurmUsageSource, accounting_problems
from gpupool_hub.engines.slurm.owners import ALLOCATION_COMMENT, HubJobOwners, allocation_of

MODELS = {"a6000": "NVIDIA RTX A6000"}


def start(tmp_path, config: str) -> GPUPoolService:
    path = tmp_path / "jupyterhub_config.py"
    path.write_text(textwrap.dedent(f"""
        c = get_config()  # noqa
        c.GPUPool.db_url = "sqlite:///{tmp_path / 'ledger.sqlite'}"
        c.GPUPool.prices = {{"RTX A6000": 4}}
    """) + textwrap.dedent(config))
    service = GPUPoolService()
    service.initialize(["--config", str(path)])
    return service


@pytest.mark.parametrize("config, message", [
    ("c.GPUPoolService.charge_batch_jobs = True",
     "charge_batch_jobs = True needs usage_preset = 'slurm'"),
    ('c.GPUPoolService.usage_preset = "slurm"',
     "needs c.GPUPool.slurm_gpu_models"),
    (f'c.GPUPoolService.usage_preset = "slurm"\nc.GPUPool.slurm_gpu_models = {MODELS!r}\n'
     'c.GPUPool.slurm_conf = "/nonexistent/slurm.conf"',
     "slurm_conf: '/nonexistent/slurm.conf' is not a file"),
    (f'c.GPUPoolService.usage_preset = "slurm"\nc.GPUPool.slurm_gpu_models = {MODELS!r}\n'
     'c.GPUPoolService.slurm_usage_options = {"settle_second": 5}',
     "unexpected keyword argument 'settle_second'"),
    (f'c.GPUPoolService.usage_preset = "slurm"\nc.GPUPool.slurm_gpu_models = {MODELS!r}\n'
     'c.GPUPoolService.slurm_usage_options = {"comment_prefix": "x"}',
     "may not set 'comment_prefix'"),
    ('c.GPUPoolService.usage_preset = "dcgm"',
     "usage_preset = 'dcgm' reads Prometheus: set c.GPUPoolService.prometheus_url"),
    ('c.GPUPoolService.slurm_usage_options = {"settle_seconds": 5}',
     "slurm_usage_options is only read with usage_preset = 'slurm'"),
    ('c.GPUPool.share_price_factors = {"mps": "1.5", "timeslice": 1}\n'
     'c.GPUPoolService.prometheus_url = "http://127.0.0.1:9"',
     "c.GPUPool.share_price_factors (mps: 1.5) prices fractions by their class, which only the service's own "
     "allocation records know; usage_preset 'gpupool' charges from prometheus:gpupool, which cannot tell"),
])
def test_a_usage_setting_that_cannot_work_stops_the_service(tmp_path, config, message):
    with pytest.raises(SystemExit) as e:
        start(tmp_path, config)
    assert message in str(e.value)


@pytest.mark.skipif(shutil.which("sacct") is None, reason="needs the Slurm client (sacct, sdiag, squeue)")
@pytest.mark.parametrize("batch", [False, True])
def test_slurm_preset_reads_the_pools_gres_map(tmp_path, batch):
    service = start(tmp_path, f"""
        c.GPUPoolService.usage_preset = "slurm"
        c.GPUPoolService.charge_batch_jobs = {batch}
        c.GPUPoolService.slurm_usage_options = {{"settle_seconds": 90}}
        c.GPUPool.slurm_gpu_models = {MODELS!r}
    """)
    source = service.manager.debits.usage_source
    assert isinstance(source, SlurmUsageSource)
    assert source.models == MODELS and source.settle_seconds == 90
    # without batch jobs only the hub's servers (whose comment names their allocation) are charged
    assert source.comment_prefix == (None if batch else ALLOCATION_COMMENT)
    assert isinstance(source.user_of, HubJobOwners) and source.user_of.charge_batch_jobs is batch


def test_default_is_the_services_own_allocation_records(tmp_path):
    assert isinstance(start(tmp_path, "").manager.debits.usage_source, AllocationRecordsSource)


def test_class_price_factors_go_with_the_allocation_records(tmp_path):
    service = start(tmp_path, 'c.GPUPool.share_price_factors = {"mps": "1.25"}')
    assert isinstance(service.manager.debits.usage_source, AllocationRecordsSource)
    assert service.manager.inventory.prices.share_factor("mps") == Decimal("1.25")
    # a factor of 1 changes nothing, so any usage source may charge
    (tmp_path / "one").mkdir()
    service = start(tmp_path / "one", 'c.GPUPool.share_price_factors = {"mps": 1}\n'
                    'c.GPUPoolService.prometheus_url = "http://127.0.0.1:9"')
    assert service.manager.debits.usage_source.name == "prometheus:gpupool"


@pytest.mark.parametrize("comment, alloc", [
    ("gpupool-allocation=3f2a-b", "3f2a-b"),
    ("gpupool-allocation=", None),
    ("gpupool-allocation=a b", None),
    ("something else", None),
    ("x gpupool-allocation=3f2a", None),
])
def test_allocation_of_reads_only_the_spawners_comment(comment, alloc):
    assert allocation_of(comment) == alloc


# `scontrol show config` of the test cluster (tests/fixtures/slurm.py), the lines that matter
SHOW_CONFIG = """Configuration data as of 2026-11-23T01:02:16
AccountingStorageHost   = localhost
AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu,gres/gpu:a6000,gres/gpu:rtx3090
AccountingStorageType   = accounting_storage/slurmdbd
AccountingStoreFlags    = job_comment
PrivateData             = none

Slurmctld(primary) at vm is UP
"""


def test_slurm_conf_fit_for_charging():
    models = {"a6000": "NVIDIA RTX A6000", "rtx3090": "NVIDIA GeForce RTX 3090"}
    assert accounting_problems(SHOW_CONFIG, models, need_comments=True) == []
    no_comment = SHOW_CONFIG.replace("job_comment", "(null)")
    [problem] = accounting_problems(no_comment, models, need_comments=True)
    assert "AccountingStoreFlags lacks job_comment" in problem
    assert accounting_problems(no_comment, models, need_comments=False) == []
    [problem] = accounting_problems(SHOW_CONFIG, {**models, "h100": "NVIDIA H100"}, need_comments=True)
    assert "AccountingStorageTRES lacks gres/gpu:h100" in problem
    none = SHOW_CONFIG.replace("accounting_storage/slurmdbd", "accounting_storage/none")
    assert "AccountingStorageType is 'accounting_storage/none'" in accounting_problems(none, models,
                                                                                       need_comments=True)[0]
