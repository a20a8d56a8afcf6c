"""Whose tokens pay for each Slurm job (HubJobOwners), on a real ledger in SQLite and PostgreSQL.

The hourly debit asks about every job of the hour: read one job at a time, the
owners of 5,000 running servers took 9 s of PostgreSQL round trips, so the
source asks about the whole interval at once (``for_jobs``), which must answer
and warn exactly as one job at a time does.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import sqlalchemy as sa

from gpupool_hub.ledger import AllocationRecord, Ledger
from gpupool_hub.engines.slurm.accounting import DELIMITER, SACCT_FIELDS, SacctJob, SlurmUsageSource
from gpupool_hub.engines.slurm.owners import ALLOCATION_COMMENT, HubJobOwners

T = 1795386676
HOUR = 3600
MODELS = {"a6000": "NVIDIA RTX A6000"}
HUB = "hubsvc"  # the Unix user the hub's servers run as


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request, tmp_path) -> Iterator[Ledger]:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}" if request.param == "sqlite" else (
        request.getfixturevalue("postgres_url"))
    ledger = Ledger(url)
    yield ledger
    ledger.close()


def at(offset: float) -> datetime:
    return datetime.fromtimestamp(T, timezone.utc) + timedelta(seconds=offset)


def hold(ledger: Ledger, alloc_id: str, user: str) -> None:
    ledger.allocations.add(AllocationRecord(
        id=alloc_id, user=user, server="", node="gpu-a", gpus=({"index": 0, "model": MODELS["a6000"]},),
        request={"gpus": 1}, price_per_hour=Decimal(4), borrowed=False, created_at=at(-60)))


def sacct_record(job_id: int, user: str, comment: str, *, running: bool = False) -> str:
    return DELIMITER.join([
        str(job_id), str(job_id), user, str(T), "Unknown" if running else str(T + HOUR),
        "RUNNING" if running else "COMPLETED", "cpu=1,gres/gpu:a6000=1,gres/gpu=1", "gpu-a", "server", comment])


def slurm(records: list[str], squeue: str = "") -> Callable[[list[str]], str]:
    answers = {"sacct": "\n".join([DELIMITER.join(SACCT_FIELDS), *records]) + "\n", "squeue": squeue}
    return lambda argv: answers[argv[0]]


def hub_source(user_of: Callable[[SacctJob], str | None], runner: Callable[[list[str]], str], *,
               batch: bool) -> SlurmUsageSource:
    """As the service builds it (gpupool_hub/service/usage.py), on recorded Slurm answers."""
    return SlurmUsageSource(MODELS, user_of=user_of, comment_prefix=None if batch else ALLOCATION_COMMENT,
                            runner=runner, check_dbd_queue=False, clock=lambda: at(2 * HOUR))


@contextmanager
def counted_reads(ledger: Ledger) -> Iterator[list[str]]:
    """The SELECTs the ledger sends, on its writer and reader engines alike."""
    seen: list[str] = []

    def count(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    # PostgreSQL's reader shares the writer's engine (its events fire there too)
    engines = [ledger.db.engine] + ([ledger.db.reader] if ledger.db.reader.pool is not ledger.db.engine.pool else [])
    for engine in engines:
        sa.event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        for engine in engines:
            sa.event.remove(engine, "before_cursor_execute", count)


@pytest.mark.parametrize("batch", [False, True])
def test_an_intervals_owners_cost_a_few_reads_whatever_the_number_of_jobs(ledger, batch):
    reads = {}
    for jobs in (3, 1200):
        for k in range(jobs):
            hold(ledger, f"n{jobs}-{k}", f"user{k}")
        records = [sacct_record(k, f"user{k}", f"{ALLOCATION_COMMENT}n{jobs}-{k}") for k in range(jobs)]
        with counted_reads(ledger) as seen:
            charges = hub_source(HubJobOwners(ledger, charge_batch_jobs=batch), slurm(records),
                                 batch=batch).charges(at(0), at(HOUR))
        assert [c.user for c in charges] == [f"user{k}" for k in range(jobs)]
        reads[jobs] = len(seen)
    # one query per 500 allocation ids, and with batch jobs one per 500 user names
    chunks = {jobs: math.ceil(jobs / 500) * (2 if batch else 1) for jobs in reads}
    assert reads == chunks, "the owners are read in bulk, not one job at a time"

    # the counter does see the ledger's reads: one job at a time reads once per job
    records = [sacct_record(k, f"user{k}", f"{ALLOCATION_COMMENT}n1200-{k}") for k in range(50)]
    owners = HubJobOwners(ledger, charge_batch_jobs=batch)
    with counted_reads(ledger) as seen:
        hub_source(lambda job: owners(job), slurm(records), batch=batch).charges(at(0), at(HOUR))
    assert len(seen) == 50


def mixed(ledger: Ledger) -> tuple[list[str], str]:
    """One interval's jobs with every way of being charged or not, and squeue's answer for the running one."""
    hold(ledger, "a-alice", "alice")
    hold(ledger, "a-bob", "bob")
    hold(ledger, "a-carol", "carol")
    for name in ("alice", "bob", "carol", "dave"):  # hub users; mallory is not
        ledger.open_account(name)
    records = [
        sacct_record(1, "alice", ALLOCATION_COMMENT + "a-alice"),  # own allocation
        sacct_record(2, HUB, ALLOCATION_COMMENT + "a-bob"),  # as the hub's Unix user
        sacct_record(3, "mallory", ALLOCATION_COMMENT + "a-alice"),  # wrong Unix user, not a hub user
        sacct_record(4, "dave", ALLOCATION_COMMENT + "a-alice"),  # wrong Unix user, a hub user
        sacct_record(5, "alice", ALLOCATION_COMMENT + "gone"),  # unknown id
        sacct_record(6, "dave", ""),  # batch job of a hub user
        sacct_record(7, "mallory", "my job"),  # batch job of a non-user
        sacct_record(8, "carol", "", running=True),  # running: its comment comes from squeue
        sacct_record(9, "carol", ALLOCATION_COMMENT + "not an id"),  # no allocation named: a batch job
    ]
    return records, f"8|RUNNING|{ALLOCATION_COMMENT}a-carol\n"


@pytest.mark.parametrize("batch", [False, True])
def test_the_whole_interval_charges_and_warns_as_one_job_at_a_time(ledger, batch, caplog):
    records, squeue = mixed(ledger)
    got = {}
    for how in ("per job", "whole interval"):
        owners = HubJobOwners(ledger, charge_batch_jobs=batch, server_users=frozenset({HUB}))
        user_of = owners if how == "whole interval" else (lambda job: owners(job))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gpupool_hub.engines.slurm.owners"):
            charges = hub_source(user_of, slurm(records, squeue), batch=batch).charges(at(0), at(HOUR))
            again = hub_source(user_of, slurm(records, squeue), batch=batch).charges(at(0), at(HOUR))
        assert again == charges  # and no warning again: once per job
        got[how] = ([(c.job.job_id, c.user, c.gpu_seconds) for c in charges], caplog.messages)
    assert got["whole interval"] == got["per job"]

    charged, warnings = got["whole interval"]
    as_batch_jobs = {"4": "dave", "5": "alice", "6": "dave", "9": "carol"} if batch else {}
    expected = {"1": "alice", "2": "bob", "8": "carol", **as_batch_jobs}
    assert charged == [(job, expected[job], HOUR) for job in sorted(expected, key=int)]
    assert [w.split(" has comment")[0] for w in warnings] == ["Slurm job 3", "Slurm job 4", "Slurm job 5"]
    assert "it ran as 'mallory', not as 'alice'" in warnings[0]
    assert "no allocation of that id" in warnings[2]
