"""The one rule for hub user names that become Unix accounts (gpupool_hub.unixname, issue 37.1)."""

from __future__ import annotations

import os
import pwd

import pytest

from gpupool_hub.unixname import RULE, UnixNameError, check_login_name, login_name_problem, unix_account


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
    assert unix_account(own.pw_name).pw_uid == own.pw_uid
    with pytest.raises(UnixNameError, match="has no Unix account on the hub's machine"):
        unix_account("gpupool-no-such-account")
    with pytest.raises(UnixNameError, match="starts with '#'"):
        unix_account(f"#{own.pw_uid}")
