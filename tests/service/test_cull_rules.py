"""The cull rules as a table: who is warned, culled or stopped, and who never is."""

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from traitlets.config import Config

from gpupool_hub.takeback.cull import Culler, UserState, decide, pressure, server_api_url, CullWarning

NOW = datetime(2026, 11, 21, 12, tzinfo=timezone.utc)
GRACE = timedelta(minutes=10)
FLOOR = Decimal(-10)


def user(name, balance, servers=("",), exempt=False):
    return UserState(name, Decimal(balance), FLOOR, tuple(servers), exempt)


def warned(minutes_ago):
    return CullWarning("kernels", "test", NOW - timedelta(minutes=minutes_ago) + GRACE)


@pytest.mark.parametrize(
    "state, warnings, under_pressure, expected",
    [
        # positive balance: never touched, pressure or not
        (user("pos", 5), {}, True, []),
        (user("zero", 0), {}, True, []),
        # negative without pressure: nothing
        (user("neg", -1), {}, False, []),
        # negative under pressure: a warning first, with a deadline
        (user("neg", -1), {}, True, [("warn", "")]),
        # warned, grace not over: nothing yet
        (user("neg", -1), {"neg": warned(5)}, True, []),
        # warned, grace over: kernels of every GPU server
        (user("neg", -1, ("", "big")), {"neg": warned(11)}, True, [("cull_kernels", ""), ("cull_kernels", "big")]),
        # warned, then pressure went away: the warning is withdrawn
        (user("neg", -1), {"neg": warned(11)}, False, [("clear_warning", "")]),
        # warned, then topped up: withdrawn
        (user("neg", 3), {"neg": warned(11)}, True, [("clear_warning", "")]),
        # at the floor: the server stops, pressure or not, no grace
        (user("broke", -10), {}, False, [("stop_server", "")]),
        (user("broke", -12.5, ("", "b")), {}, True, [("stop_server", ""), ("stop_server", "b")]),
        # exempt users are never touched, even at the floor
        (user("vip", -50, exempt=True), {}, True, []),
        (user("vip", -5, exempt=True), {"vip": warned(20)}, True, [("clear_warning", "")]),
    ],
)
def test_decisions(state, warnings, under_pressure, expected):
    decisions = decide([state], warnings, "pool full" if under_pressure else None, NOW, GRACE)
    assert [(d.action, d.server) for d in decisions] == expected
    for d in decisions:
        assert d.user == state.user and d.reason
        if d.action == "warn":
            assert d.deadline == NOW + GRACE


def culler(**kw):
    c = Config()
    for k, v in kw.items():
        setattr(c.Culler, k, v)
    return Culler(config=c)


def test_pressure_from_allocation_refusals_and_utilization():
    c = culler()
    assert pressure(Decimal(13), Decimal(16), None, NOW, c) is not None  # 81 % > 80 %
    assert pressure(Decimal(12), Decimal(16), None, NOW, c) is None  # 75 %
    recent = NOW - timedelta(minutes=3)
    assert "refused" in pressure(Decimal(0), Decimal(16), recent, NOW, c)
    assert pressure(Decimal(0), Decimal(16), NOW - timedelta(minutes=30), NOW, c) is None
    assert pressure(Decimal(0), Decimal(16), None, NOW, c, utilization=0.99) is None  # off by default
    c = culler(pressure_utilization=0.9, pressure_allocated_fraction=0.5)
    assert "utilization" in pressure(Decimal(0), Decimal(16), None, NOW, c, utilization=0.95)
    assert pressure(Decimal(9), Decimal(16), None, NOW, c) is not None


# Issue 23 item 2: the pressure rule judges servers by their own figures, never the GPU's.
@pytest.mark.parametrize(
    "holdings, judged, expected",
    [
        # alice (90 %) and bob (0 %) share GPU-s half each; 4 GPUs in the pool
        ([("alice", "0.5", 0.9), ("bob", "0.5", 0.0)], "bob", 0.9 / 3.5),   # alice's work presses on bob
        ([("alice", "0.5", 0.9), ("bob", "0.5", 0.0)], "alice", 0.0),       # her own work is no pressure on her
        ([("alice", "1", 0.8), ("carol", "1", None)], "bob", 0.8 / 3),     # carol unknown: counts neither way
        ([("carol", "1", None)], "bob", None),                              # nothing known: no figure at all
        ([("carol", "1", None), ("bob", "1", 0.7)], "bob", None),           # ... bob's own figure does not count
        ([], "bob", 0.0),                                                   # nobody holds anything: idle
        ([("alice", "1", 1.0)] * 4, "bob", 1.0),
    ],
)
def test_23_pressure_from_others_own_utilization(holdings, judged, expected):
    from gpupool_hub.takeback.cull import others_utilization

    got = others_utilization(judged, [(u, Decimal(g), x) for u, g, x in holdings], Decimal(4))
    assert got == (None if expected is None else pytest.approx(expected)), got


def test_server_api_url_quotes_names():
    assert server_api_url("http://h:8000/", "o'brien@x", "") == "http://h:8000/user/o%27brien%40x/api/"
    assert server_api_url("http://h:8000", "a", "my srv") == "http://h:8000/user/a/my%20srv/api/"


# Issue 12, item 11: a user's own refused spawn is no pressure on that user.
@pytest.mark.parametrize(
    "refusals, judged, under_pressure",
    [
        ({"bob": 3}, "bob", False),             # only bob was refused: not pressure for bob
        ({"bob": 3}, "alice", True),            # ... but for everyone else
        ({"bob": 3, "carol": 5}, "bob", True),  # carol was refused too: pressure for bob
        ({"bob": 3, "carol": 30}, "bob", False),  # carol's refusal is too old
        ({}, "bob", False),
    ],
)
def test_12_11_own_refusal_is_not_pressure(refusals, judged, under_pressure):
    from gpupool_hub.takeback.cull import last_refusal_of_others

    at = {user: NOW - timedelta(minutes=minutes) for user, minutes in refusals.items()}
    why = pressure(Decimal(0), Decimal(16), last_refusal_of_others(at, judged), NOW, culler())
    assert (why is not None) == under_pressure, why
    decisions = decide([user(judged, -1)], {}, why, NOW, GRACE)
    assert [d.action for d in decisions] == (["warn"] if under_pressure else [])


def test_12_11_enforcement_keeps_refusals_per_user():
    from gpupool_hub.service.core.enforcement import Enforcement

    e = Enforcement()
    e.note_capacity_refusal("bob", NOW - timedelta(minutes=2))
    e.note_capacity_refusal("bob", NOW - timedelta(minutes=1))
    assert e.last_refusal_excluding("bob") is None
    assert e.last_refusal_excluding("alice") == NOW - timedelta(minutes=1)
