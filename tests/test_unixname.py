"""The one rule for hub user names that become Unix accounts (gpupool_hub.identity.unix, issue 37.1)."""

from __future__ import annotations

import os
import pwd
import re

import pytest

from traitlets import TraitError
from traitlets.config import Config

from gpupool_hub.config import account_rule_from_config
from gpupool_hub.identity.unix import (FALLBACK_UID_RANGE, RULE, AccountRule, UnixNameError, check_login_name,
    login_name_problem, ordinary_uid_range, unix_account)


@pytest.mark.parametrize("name, problem", [
    ("alice", None),
    ("a.b_c-d", None),
    ("_svc", None),
    ("x1001", None),
    ("A" * 32, None),
    ("#0", "starts with '#'"),
    ("#1001", "starts with '#'"),
    ("-u", "starts with '-'"),
    ("--user=root", "starts with '-'"),
    ("alice bob", "contains ' '"),
    ("o'neil", "contains \"'\""),
    ("a/b", "contains '/'"),
    ("al\nice", "contains '\\n'"),
    ("müller", "contains 'ü'"),
    ("a#0", "contains '#'"),
    ("", "is empty"),
    ("A" * 33, "is 33 characters long"),
    ("1001", "is only digits (read as a uid)"),
    ("..", "is only dots (a path step)"),
])
def test_login_names(name, problem):
    assert login_name_problem(name) == problem


def test_the_error_names_the_name_and_the_whole_rule():
    with pytest.raises(UnixNameError) as e:
        check_login_name("#0")
    assert str(e.value) == f"'#0' starts with '#'; {RULE}"


def test_an_account_is_looked_up_only_for_a_login_name():
    own = pwd.getpwuid(os.getuid())
    everyone = AccountRule(uid_min=1, uid_max=2**32, denied=frozenset(), own_uid=-1)  # the lookup alone
    assert unix_account("daemon", everyone).pw_uid == pwd.getpwnam("daemon").pw_uid
    with pytest.raises(UnixNameError, match="has no Unix account on the hub's machine"):
        unix_account("gpupool-no-such-account")
    with pytest.raises(UnixNameError, match="starts with '#'"):
        unix_account(f"#{own.pw_uid}")


# --- issue 48.1: an existing account is not enough; root and system accounts never run a server


@pytest.mark.parametrize("text, expected", [
    ("UID_MIN 1000\nUID_MAX 60000\n", (1000, 60000)),
    ("# comment\nUID_MIN\t\t\t 500 # trailing\n#UID_MAX 1\nUID_MAX 29999\n", (500, 29999)),
    ("UID_MIN 2000\n", (2000, FALLBACK_UID_RANGE[1])),
    ("UID_MIN 2000\nUID_MIN 3000\n", (3000, FALLBACK_UID_RANGE[1])),  # the last one counts
    ("UID_MIN 0\nUID_MAX 60000\n", FALLBACK_UID_RANGE),  # root never comes into the range
    ("UID_MIN 5000\nUID_MAX 100\n", FALLBACK_UID_RANGE),  # not a range
    ("UID_MIN 0x10\nUID_MAX lots\n", FALLBACK_UID_RANGE),  # not decimal numbers
    ("\x00\xff garbage", FALLBACK_UID_RANGE),
    ("", FALLBACK_UID_RANGE),
])
def test_the_ordinary_uids_come_from_login_defs(tmp_path, text, expected):
    defs = tmp_path / "login.defs"
    defs.write_text(text, encoding="latin-1")
    assert ordinary_uid_range(str(defs)) == expected


def test_without_login_defs_the_ordinary_uids_are_1000_to_60000(tmp_path):
    assert ordinary_uid_range(str(tmp_path / "missing")) == (1000, 60000) == FALLBACK_UID_RANGE


def _account(name: str, uid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, uid, "", "/home/" + name, "/bin/sh"))


@pytest.mark.parametrize("name, uid, problem", [
    ("alice", 1000, None),
    ("bob", 60000, None),
    ("root", 0, "is the superuser's account (uid 0)"),
    ("daemon", 1, "uid 1 is outside the ordinary accounts' uids 1000-60000"),
    ("postgres", 101, "uid 101 is outside"),
    ("nobody", 65534, "uid 65534 is outside"),
    ("Munge", 5000, "on the deny list (c.GPUPool.unix_denied_names)"),  # by name, whatever its uid
    ("hubsvc", 4242, "is the account the hub itself runs as (uid 4242)"),
])
def test_the_account_rule(name, uid, problem):
    rule = AccountRule.of(1000, 60000, ["munge"])
    rule = AccountRule(rule.uid_min, rule.uid_max, rule.denied, own_uid=4242)
    found = rule.problem(_account(name, uid))
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


@pytest.mark.parametrize("name", ["root", "daemon", "nobody"])
def test_system_accounts_of_this_machine_are_refused_by_default(name):
    """The accounts every Debian machine has: the default rule (login.defs, the deny list) refuses them,
    naming why and the setting that says so."""
    with pytest.raises(UnixNameError) as e:
        unix_account(name)
    assert "never as root, a system account" in str(e.value)
    assert str(e.value).startswith(f"{name!r} is ")


def test_the_hub_setting_narrows_and_widens_the_range():
    wide = account_rule_from_config(Config({"GPUPool": {"unix_uid_min": 1, "unix_denied_names": []}}))
    assert wide.problem(_account("daemon", 1)) is None
    narrow = account_rule_from_config(Config({"GPUPool": {"unix_uid_min": 5000, "unix_uid_max": 6000}}))
    assert "uid 1000 is outside the ordinary accounts' uids 5000-6000" in narrow.problem(_account("alice", 1000))
    default = account_rule_from_config(Config())
    assert (default.uid_min, default.uid_max) == ordinary_uid_range()
    assert "postgres" in default.denied and "www-data" in default.denied


@pytest.mark.parametrize("settings, message", [
    ({"unix_uid_min": 0}, "c.GPUPool.unix_uid_min and unix_uid_max must be at least 1 (root never runs a server)"),
    ({"unix_uid_min": 7000, "unix_uid_max": 6000}, "unix_uid_min (7000) is above c.GPUPool.unix_uid_max (6000)"),
    ({"unix_uid_max": "lots"}, "unix_uid_max"),
])
def test_a_bad_account_setting_names_itself(settings, message):
    with pytest.raises(TraitError, match=re.escape(message)):
        account_rule_from_config(Config({"GPUPool": settings}))


def test_unrelated_pool_settings_do_not_reach_the_spawners_account_check():
    """A mistake elsewhere in c.GPUPool is the service's to report at its start; the account rule still loads."""
    rule = account_rule_from_config(Config({"GPUPool": {"prices": "not a dict", "unix_uid_min": 1500}}))
    assert rule.uid_min == 1500
