"""People see what their GPUs did (issue 23 item 5): real processes of two real Unix users
share one fake GPU (one busy at 90 %, one idle), the agent's real code reports to the real
service app (in-process, SQLite); the gpu-use job records each minute per user and team in
the ledger, "My GPU usage" shows each day's charge with how busy the user's GPUs were, and
the admins' "Idle GPU-hours" page lists the idle user and team first. Chromium takes the
screenshots for docs/images/ (build/screenshots/pages/, copied by scripts/update-screenshots.sh).

What a wrong answer would cost: a user told their idle share was busy (or the reverse) pays
without knowing why; admins chasing idle GPU-hours pick the wrong people.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

from gpupool_hub.ledger import Posting
from gpupool_hub.placement import Request
from gpupool_hub.service.jobs.gpuuse import GpuUseJob
from gpupool_hub.service.common.metrics import ServiceMetrics
from gpupool_hub.usage.utilization import ReportedUtilization
from tests.agent.conftest import A100, GIB, gpu
from tests.agent.test_service import make_agent
from tests.agent.test_shared_truth import NODES, T1, T2, TOKENS, until_async
from tests.fixtures.manager import make_manager
from tests.pages.inprocess import PREFIX, PagesService, attrs, chromium_on, user_model

TEAMS = {"physics": {"gpus": 1}, "biology": {"gpus": 1}}
MODELS = {"admin-login": user_model("ada", admin=True), "t1-login": user_model(T1), "t2-login": user_model(T2)}


def shared_gpu(tmp_path):
    """t1 (physics) and t2 (biology) share GPU 0, half each."""
    m = make_manager(NODES, {"A100": 2}, f"sqlite:///{tmp_path}/ledger.sqlite", teams=TEAMS)
    shared = {u: m.admission.admit(u, [team], "", Request(gpu_milli=500), None)
              for u, team in ((T1, "physics"), (T2, "biology"))}
    assert {g["uuid"] for r in shared.values() for g in r.gpus} == {"GPU-0000-fake"}
    return m, shared


async def test_my_gpu_usage_shows_busy_per_day_and_admins_see_idle_gpu_hours(procs, make_nvml, tmp_path):
    m, shared = shared_gpu(tmp_path)
    busy, idle = procs.sleeper(T1), procs.sleeper(T2)
    nv = make_nvml([gpu(0, utilization=90, processes=[{"pid": busy.pid, "memory": GIB, "sm": 90},
                                                      {"pid": idle.pid, "memory": GIB}]), gpu(1)])
    source = ReportedUtilization(m.settings.idle_threshold)
    service = PagesService(m, MODELS, agent_tokens=dict(TOKENS), utilization=source)
    try:
        agent = make_agent(nv, service.origin + PREFIX)
        metrics = ServiceMetrics(m)  # the service's /metrics, wired as app.py does
        job = GpuUseJob(source, records=m.records, log=m.gpu_use, settings=m.settings,
                        on_recorded=metrics.count_gpu_use)

        async def reported():  # the first report may time out while the service warms up (its schemas)
            if not (await agent.tick()).service_ok:
                return False
            return (T2, "GPU-0000-fake") in await source.user_readings([(T2, "GPU-0000-fake")], 60)

        await until_async(reported, "the agent's per-user figures reach the service")
        # ten minutes of this morning, one interval each (the job marks each minute done)
        start = datetime.now(timezone.utc).replace(second=30, microsecond=0) - timedelta(minutes=10)
        for i in range(10):
            assert await job(start + timedelta(minutes=i))
        assert not await job(start + timedelta(minutes=9))  # a rerun of a recorded minute adds nothing
        # what the minutes cost, as the debit job would charge them
        for user in (T1, T2):
            m.ledger.post(Posting(user, "debit", Decimal("-0.167"), f"test-debit-{user}", interval_start=start,
                                  interval_end=start + timedelta(minutes=10), model=A100))

        today = start.astimezone(m.settings.tz).date()
        use = {u: m.ledger.reports.gpu_use_of(u, today, today)[today] for u in (T1, T2)}
        # 10 minutes of half a GPU: 300 GPU-seconds; t1 busy at 0.9 of the GPU fills its 0.5 share
        assert (use[T1].held_milli, use[T1].busy_milli, use[T1].unknown_milli) == (300_000, 300_000, 0)
        assert (use[T2].held_milli, use[T2].busy_milli, use[T2].idle_milli) == (300_000, 0, 300_000)
        assert m.ledger.reports.idle_gpu_time("team", today) == [("biology", 300_000, 300_000), ("physics", 0, 300_000)]
        # /metrics counts each recorded minute once, the rerun not again (the Grafana panels' source)
        for user, team, busy_seconds in ((T1, "physics", 300), (T2, "biology", 0)):
            counted = [metrics.registry.get_sample_value(f"gpupool_gpu_{name}_seconds_total", {"user": user, "team": team})
                       for name in ("held", "busy", "unknown")]
            assert counted == [300, busy_seconds, 0], (user, counted)

        for login, busy_text in (("t1-login", "your GPUs were busy 100 % of that time"),
                                 ("t2-login", "your GPUs were busy 0 % of that time")):
            page = (await service.client(login).get("")).body.decode()
            [row] = attrs(page, "data-day=")
            assert row["data-day"] == today.isoformat()
            assert "You paid 0.167 tokens; " + busy_text in page, page
        page = (await service.client("t2-login").get("")).body.decode()
        assert T1 not in page  # only her own figures

        admin = (await service.client("admin-login").get("admin/idle")).body.decode()
        for days in (7, 30):
            for by, first in (("user", T2), ("team", "biology")):
                table = admin.split(f'data-gpupool="idle-{by}-{days}"')[1].split("</table>")[0]
                rows = attrs(table, "data-name=")
                assert rows[0]["data-name"] == first and rows[0]["data-idle-hours"] == "0.08", rows
        assert (await service.client("t1-login").get("admin/idle")).code == 403

        await screenshots(service)
    finally:
        service.stop()


async def screenshots(service: PagesService) -> None:
    """The two pages in headless Chromium (async: the in-process service runs on this loop)."""
    from tests.pages.conftest import SCREENSHOTS

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    async with chromium_on(service) as open_as:
        for login, path_, name in (("t1-login", "", "my-usage-gpu-busy.png"),
                                   ("admin-login", "admin/idle", "admin-idle-gpu-hours.png")):
            page = await open_as(login)
            await page.goto(f"{service.origin}{PREFIX}{path_}", wait_until="domcontentloaded")
            target = page.locator('[data-gpupool="gpu-days"]' if not path_ else '[data-gpupool="idle-user-7"]')
            await target.scroll_into_view_if_needed()
            assert await target.is_visible()
            await page.screenshot(path=str(SCREENSHOTS / name), full_page=not path_ == "")
            await page.context.close()
