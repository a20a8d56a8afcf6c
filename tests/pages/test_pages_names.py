"""The pages keep the API's rule for names (issue 37 point 5), over real HTTP: a grant to, or an
admin's look at, a name holding a bidirectional or zero-width control is refused with a page that
says why, and nothing is written (no account, no entry)."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.fixtures.manager import make_manager

from .inprocess import PagesService, field, user_model

NODES = [{"name": "node-a", "cpu_milli": 8000, "memory_mib": 32768,
          "gpus": {"count": 1, "model": "NVIDIA RTX A6000"}}]
REVERSED = "bob\u202enimda"  # shows as "bobadmin"
HIDDEN = ["ad\u200bmin", REVERSED, "\ufeffalice", "eve\u2066x"]


@pytest.fixture
async def service(tmp_path):
    manager = make_manager(NODES, {"RTX A6000": 4}, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    s = PagesService(manager, {"admin-token": user_model("admin", admin=True)})

    async def hub_user(name):  # the hub knows every name asked for: only the name rule refuses
        return {"name": name}

    s.context.hub = type("Hub", (), {"user": staticmethod(hub_user)})()
    yield s
    s.stop()


@pytest.mark.parametrize("user", HIDDEN)
async def test_the_grant_form_refuses_a_name_with_an_invisible_control(service, user):
    admin = service.client("admin-token")
    page = (await admin.get("admin/grant")).body.decode()
    form = {"user": user, "amount": "25", "reason": "welcome", "key": field(page, "key"),
            "_xsrf": field(page, "_xsrf")}
    answer = await admin.post("admin/grant", form)
    assert answer.code == 400
    assert "U+" in answer.body.decode() and "zero-width" in answer.body.decode()
    assert service.manager.ledger.accounts(limit=100) == []  # no account, no entry


@pytest.mark.parametrize("user", HIDDEN)
async def test_an_admins_user_page_refuses_such_a_name_and_opens_no_account(service, user):
    answer = await service.client("admin-token").get(f"admin/users/{quote(user, safe='')}")
    assert answer.code == 400 and "zero-width" in answer.body.decode()
    assert service.manager.ledger.accounts(limit=100) == []


async def test_names_in_any_script_still_get_their_page(service):
    answer = await service.client("admin-token").get(f"admin/users/{quote('张伟', safe='')}")
    assert answer.code == 200
