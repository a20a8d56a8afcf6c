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

A name can also be a perfectly ordinary login name of an account that must
never run a user's server: ``root``, ``daemon``, ``nobody``, ``postgres``, or
``munge`` (which reads the MUNGE key and can forge Slurm credentials for any
uid). An OAuth or LDAP authenticator admits such names, and JupyterHub
lower-cases logins (``DaEmOn`` is ``daemon``). So an account is also checked
against an :class:`AccountRule`: its uid must lie in the range of ordinary
accounts (``UID_MIN``..``UID_MAX`` of ``/etc/login.defs``, else
:data:`FALLBACK_UID_RANGE`, the range the node agent also takes for its users:
:func:`ordinary_uid_range`), its name must not be on the deny list, and it must
not be the account the hub itself runs as.

The syntax rule (:func:`login_name_problem`) is pure; :func:`unix_account`
adds the lookup and the account rule. The spawners turn :class:`UnixNameError`
into a 403 refusal (``spawner/errors.py: refuse_unix_name``) before they ask
the pool for GPUs.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["FALLBACK_UID_RANGE", "LOGIN_DEFS", "MAX_LENGTH", "RULE", "SYSTEM_NAMES", "AccountRule", "UnixNameError",
           "check_login_name", "login_name_problem", "ordinary_uid_range", "starts_unsafely", "unix_account"]

#: the longest name accepted (utmp's and useradd's limit on Linux)
MAX_LENGTH = 32

#: the rule as users and admins are told it
RULE = (f"a user name that runs a server must be a Unix login name: letters, digits, '_', '-' and '.', "
        f"not starting with '-' or '#', not only digits or dots, at most {MAX_LENGTH} characters")

#: where useradd keeps the range of ordinary (non-system) uids
LOGIN_DEFS = "/etc/login.defs"
#: the ordinary uids when login.defs says nothing usable: useradd's own defaults on Debian and Red Hat
FALLBACK_UID_RANGE = (1000, 60000)

#: accounts that never run a user's server, whatever uid they have: the system accounts Debian, Red Hat and
#: the programs beside a hub (databases, Slurm, MUNGE, web servers) create. Refused even where an admin
#: widens the uid range; the uid range already keeps out the ones it does not name.
SYSTEM_NAMES = frozenset({
    "root", "toor", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
    "www-data", "backup", "list", "irc", "gnats", "nobody", "nogroup", "nfsnobody", "_apt", "operator", "adm",
    "halt", "shutdown", "ftp", "messagebus", "sshd", "polkitd", "systemd-network", "systemd-resolve",
    "systemd-timesync", "systemd-coredump", "dbus", "postgres", "mysql", "mariadb", "redis", "munge", "slurm",
    "prometheus", "nginx", "apache", "httpd", "jupyterhub", "docker", "lxd", "nvidia-persistenced",
})

_ALLOWED = re.compile(r"[A-Za-z0-9_.-]*")
_OTHER = re.compile(r"[^A-Za-z0-9_.-]")


class UnixNameError(ValueError):
    """A hub user name that must not become a Unix account, a command argument or a unit name.

    ``str()`` says what is wrong with this name and then the whole rule, so a refusal
    built from it names the rule.
    """

    def __init__(self, name: str, problem: str, *, account_rule: bool = False) -> None:
        self.name = name
        self.problem = problem
        # a refused account names the account rule; a refused name, the name rule
        rule = ("a server runs only as an ordinary user's account, never as root, a system account or the "
                "hub's own" if account_rule else RULE)
        super().__init__(f"{name!r} {problem}; {rule}")


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


def _login_defs_value(text: str, key: str) -> int | None:
    """The decimal value of ``key`` in login.defs text (``UID_MIN 1000``), or None if absent or not a number."""
    value = None
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == key:
            value = int(words[1]) if words[1].isdigit() else None  # the last one counts, as in shadow's reader
    return value


def ordinary_uid_range(path: str = LOGIN_DEFS) -> tuple[int, int]:
    """The uids of ordinary accounts, ``(UID_MIN, UID_MAX)`` from ``path`` (``/etc/login.defs``).

    The same range is the default of who may run a server (:class:`AccountRule`) and of whom the node
    agent counts as a user (``c.GPUPoolAgent.min_uid``). A missing or unreadable file, or a range that
    is not one (a value that is no number, 0, or a minimum above the maximum), gives
    :data:`FALLBACK_UID_RANGE`, never an error: root must never come into the range by a bad file.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return FALLBACK_UID_RANGE
    low = _login_defs_value(text, "UID_MIN")
    high = _login_defs_value(text, "UID_MAX")
    low = FALLBACK_UID_RANGE[0] if low is None else low
    high = FALLBACK_UID_RANGE[1] if high is None else high
    if low < 1 or high < low:
        return FALLBACK_UID_RANGE
    return low, high


@dataclass(frozen=True)
class AccountRule:
    """Which existing accounts may run a user's server: a uid within ``uid_min``..``uid_max``, a name
    not in ``denied``, and never uid 0 nor the account the hub runs as (``own_uid``), whatever the range.

    Built by the spawners from the hub's ``c.GPUPool.unix_uid_min``, ``unix_uid_max`` and
    ``unix_denied_names`` (``config.account_rule_from_config``), whose defaults are
    :func:`ordinary_uid_range` and :data:`SYSTEM_NAMES`.
    """

    uid_min: int = FALLBACK_UID_RANGE[0]
    uid_max: int = FALLBACK_UID_RANGE[1]
    denied: frozenset[str] = SYSTEM_NAMES
    own_uid: int = field(default_factory=os.geteuid)

    @classmethod
    def of(cls, uid_min: int, uid_max: int, denied: Iterable[str]) -> "AccountRule":
        """The rule of the hub's settings, names compared in lower case as JupyterHub's logins are;
        ValueError, naming the settings, for a range that would let root in or no account at all."""
        if uid_min < 1 or uid_max < 1:
            raise ValueError(f"c.GPUPool.unix_uid_min and unix_uid_max must be at least 1 (root never runs a "
                             f"server), got {uid_min} and {uid_max}")
        if uid_min > uid_max:
            raise ValueError(f"c.GPUPool.unix_uid_min ({uid_min}) is above c.GPUPool.unix_uid_max ({uid_max}): "
                             "no account could run a server")
        return cls(uid_min, uid_max, frozenset(n.lower() for n in denied))

    def problem(self, account: pwd.struct_passwd) -> str | None:
        """Why ``account`` may not run a server (a phrase after the name), or None if it may."""
        uid = account.pw_uid
        if uid == 0:
            return "is the superuser's account (uid 0)"
        if uid == self.own_uid:
            return f"is the account the hub itself runs as (uid {uid})"
        if not self.uid_min <= uid <= self.uid_max:
            return (f"is a system account: uid {uid} is outside the ordinary accounts' uids {self.uid_min}-"
                    f"{self.uid_max} (c.GPUPool.unix_uid_min, unix_uid_max)")
        if account.pw_name.lower() in self.denied:
            return "is a system account on the deny list (c.GPUPool.unix_denied_names)"
        return None


def unix_account(name: str, rule: AccountRule | None = None) -> pwd.struct_passwd:
    """The Unix account a server of ``name`` runs as: a login name by :data:`RULE` that
    ``pwd.getpwnam`` finds and ``rule`` allows (default: :class:`AccountRule` with the ordinary uids of
    this machine and :data:`SYSTEM_NAMES`); else :class:`UnixNameError`. The name is checked first, so
    it never reaches the lookup (or a name service behind it) unless it is an ordinary name."""
    check_login_name(name)
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise UnixNameError(name, "has no Unix account on the hub's machine") from None
    if rule is None:
        rule = AccountRule(*ordinary_uid_range())
    problem = rule.problem(account)
    if problem is not None:
        raise UnixNameError(name, problem, account_rule=True)
    return account
