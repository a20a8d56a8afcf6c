"""Which hub user names may become a Unix account: one rule for every spawner that runs a server as one.

A hub user name is whatever the authenticator let in; the spawners that run a
server as a Unix account hand it to programs that read more into a name than a
name. ``sudo -u '#0'`` and ``runuser -u '#0'`` take ``#<number>`` as a *uid*
(a hub user ``#0`` ran its Slurm job as root, ``#1001`` as somebody else), a
leading ``-`` makes an option of it, systemd reads a name of digits only as a
uid, and ``.`` / ``..`` are path steps in ``{username}`` templates (homes,
``StateDirectory=``). Keeping the name one argument (``command_argv``) does
not help against any of these. So a name reaches a command, a uid lookup or a
unit name only if it is an ordinary login name (:data:`RULE`) and, where it
becomes an account, ``pwd.getpwnam`` finds that account.

The syntax rule (:func:`login_name_problem`) is pure; :func:`unix_account`
adds the lookup. The spawners turn :class:`UnixNameError` into a 403 refusal
(``spawner/errors.py: refuse_unix_name``) before they ask the pool for GPUs.
"""

from __future__ import annotations

import pwd
import re

__all__ = ["MAX_LENGTH", "RULE", "UnixNameError", "check_login_name", "login_name_problem", "starts_unsafely",
           "unix_account"]

#: the longest name accepted (utmp's and useradd's limit on Linux)
MAX_LENGTH = 32

#: the rule as users and admins are told it
RULE = (f"a user name that runs a server must be a Unix login name: letters, digits, '_', '-' and '.', "
        f"not starting with '-' or '#', not only digits or dots, at most {MAX_LENGTH} characters")

_ALLOWED = re.compile(r"[A-Za-z0-9_.-]*")
_OTHER = re.compile(r"[^A-Za-z0-9_.-]")


class UnixNameError(ValueError):
    """A hub user name that must not become a Unix account, a command argument or a unit name.

    ``str()`` says what is wrong with this name and then the whole rule, so a refusal
    built from it names the rule.
    """

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        self.problem = problem
        super().__init__(f"{name!r} {problem}; {RULE}")


def starts_unsafely(value: str) -> bool:
    """Whether a value put into a command's argument would be read as an option (``-``) or a uid (``#``)."""
    return value.startswith(("-", "#"))


def login_name_problem(name: str) -> str | None:
    """What keeps ``name`` from being a login name (e.g. "starts with '#'"), or None if it is one."""
    if not name:
        return "is empty"
    if starts_unsafely(name):
        return f"starts with {name[0]!r}"
    if len(name) > MAX_LENGTH:
        return f"is {len(name)} characters long"
    if not _ALLOWED.fullmatch(name):
        bad = sorted(set(_OTHER.findall(name)))
        return "contains " + ", ".join(repr(c) for c in bad)
    if name.strip("0123456789") == "":
        return "is only digits (read as a uid)"
    if name.strip(".") == "":
        return "is only dots (a path step)"
    return None


def check_login_name(name: str) -> str:
    """``name`` if it is a login name by :data:`RULE`; else :class:`UnixNameError`."""
    problem = login_name_problem(name)
    if problem is not None:
        raise UnixNameError(name, problem)
    return name


def unix_account(name: str) -> pwd.struct_passwd:
    """The Unix account a server of ``name`` runs as: a login name by :data:`RULE` that
    ``pwd.getpwnam`` finds; else :class:`UnixNameError`. The name is checked first, so it never
    reaches the lookup (or a name service behind it) unless it is an ordinary name."""
    check_login_name(name)
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise UnixNameError(name, "has no Unix account on the hub's machine") from None
