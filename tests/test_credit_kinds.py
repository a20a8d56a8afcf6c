"""A kind of scheduled credit is stated once (``money.credits.SCHEDULED``, issue 49.3): the ledger's entry
kinds, ``GET me``'s ``credits`` object in ``openapi.json``, the JupyterLab widget's ``ICredits`` and what a
user reads follow it. A kind added or renamed in one place and not the others fails here."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

from gpupool_hub.ledger.records import KINDS
from gpupool_hub.money.credits import CREDIT_ENTRY_KINDS, SCHEDULED
from gpupool_hub.money.shortfall import shortfall_message
from gpupool_hub.spawner.form import _credit_lines

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = json.loads((ROOT / "gpupool_hub" / "service" / "openapi.json").read_text())["components"]["schemas"]
#: what GET me's credits object holds besides the scheduled credits
OTHER_CREDIT_FIELDS = {"max_balance"}


def credit_fields() -> set[str]:
    return {k.name for k in SCHEDULED} | {k.next_at for k in SCHEDULED} | OTHER_CREDIT_FIELDS


def test_openapi_states_the_scheduled_credits_and_the_ledger_kinds():
    credits = SCHEMAS["Me"]["properties"]["credits"]
    assert set(credits["properties"]) == credit_fields()
    assert set(credits["required"]) == credit_fields()
    assert set(SCHEMAS["Entry"]["properties"]["kind"]["enum"]) == set(KINDS)
    assert set(CREDIT_ENTRY_KINDS) <= set(KINDS)


def test_the_widgets_types_name_the_same_credit_fields():
    types = (ROOT / "labextension" / "src" / "types.ts").read_text()
    body = re.search(r"export interface ICredits \{(.*?)\}", types, re.S)
    assert body, "labextension/src/types.ts has no ICredits"
    assert set(re.findall(r"^\s*(\w+)\s*:", body.group(1), re.M)) == credit_fields()


def test_each_kind_is_said_in_its_own_words_on_the_form_and_in_a_refusal():
    account = {"credits": {**{k.name: "2.000" for k in SCHEDULED},
                           **{k.next_at: "2026-12-01T00:00:00Z" for k in SCHEDULED}}}
    lines = _credit_lines(account)
    assert [line["kind"] for line in lines] == [k.name for k in SCHEDULED]
    for kind, line in zip(SCHEDULED, lines):
        assert kind.every in line["text"]
    for kind in SCHEDULED:
        details = {"balance": "0.000", "floor": "0.000", "needs": "5.000", "price_per_hour": "5.000",
                   "credit": kind.name}
        said = shortfall_message(details, datetime(2026, 12, 1, tzinfo=timezone.utc), lambda at: "Tue 1 Dec")
        assert f"With {kind.words} you can start it from Tue 1 Dec." in said
