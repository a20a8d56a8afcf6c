"""``c.GPUPool``: the pool-wide settings admins write in ``jupyterhub_config.py``.

The hub (through the spawner) and the gpupool service read the same file, so
prices, grants and the database are configured once. Every value is checked
when the configuration loads; an error names the trait and the bad value.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from traitlets import Bool, Dict, Float, Integer, List, TraitError, TraitType, Unicode, default, validate
from traitlets.config import Config, Configurable

from .money.credits import CreditRules, rules_for_groups
from .engines import engine, engines
from .identity.names import name_problem
from .money.pricing import PriceTable, PricingError, parse_mig_prices, parse_share_factors
from .money.units import AmountError, parse_amount
from .identity.unix import SYSTEM_NAMES, AccountRule, ordinary_uid_range


class TokenAmount(TraitType):  # type: ignore[type-arg]
    """A token amount given as int, float, str or Decimal; held as an exact Decimal."""

    info_text = "a token amount (number)"

    def __init__(self, default_value: Any = None, *, allow_none: bool = False, minimum: Decimal | None = None,
                 maximum: Decimal | None = None, **kwargs: Any) -> None:
        self.minimum, self.maximum = minimum, maximum
        super().__init__(default_value=default_value, allow_none=allow_none, **kwargs)

    def validate(self, obj: Any, value: Any) -> Decimal | None:
        if value is None and self.allow_none:
            return None
        where = f"c.{type(obj).__name__}.{self.name}"
        try:
            amount = parse_amount(value, what=where)
        except AmountError as e:
            raise TraitError(str(e)) from None
        if self.minimum is not None and amount < self.minimum:
            raise TraitError(f"{where} must be at least {self.minimum}, got {value!r}")
        if self.maximum is not None and amount > self.maximum:
            raise TraitError(f"{where} must be at most {self.maximum}, got {value!r}")
        return amount


def engine_settings() -> tuple[type, ...]:
    """The engines' own ``c.GPUPool`` settings (``engines.Engine.settings``), which ``GPUPool`` is made of."""
    return tuple(e.settings for e in engines() if e.settings is not None)


def _check_names(names: Any, what: str) -> None:
    """TraitError for a name the service would refuse in a request (``gpupool_hub/identity/names.py``):
    a team, group, node or GPU model that no agent, spawner or admin could then name."""
    for name in names:
        if isinstance(name, str) and (problem := name_problem(name)):
            raise TraitError(f"{what} name {name!r} {problem}")


class GPUPool(*engine_settings(), Configurable):  # type: ignore[misc]
    """Prices, credit rules and storage shared by the spawner and the service; each engine adds its own
    settings (``engines.Engine.settings``: ``c.GPUPool.slurm_*``)."""

    prices = Dict(
        {},
        help="""Tokens per GPU-hour for each GPU model, e.g.
        ``{"RTX 2080": 0.5, "RTX 3090": 1, "RTX A6000": 4}``.

        Names are matched against the model strings NVML and DCGM report
        ("NVIDIA GeForce RTX 3090 Ti") by whole words, case-insensitively; the
        entry with the most matching words wins, so "RTX 3090 Ti" beats
        "RTX 3090". A fraction of a GPU costs its share of the price.
        """,
    ).tag(config=True)

    mig_prices = Dict(
        {},
        help="""Tokens per hour of one MIG instance, per MIG profile, e.g.
        ``{"1g.10gb": "0.6", "3g.40gb": "1.5"}``.

        A profile missing here costs its share of its GPU's compute slices
        times the GPU model's price from `prices`: a 1g instance is 1/7 of an
        A100's price (1/4 of an A30's), a 3g is 3/7. Default: empty (every
        instance priced by slices).
        """,
    ).tag(config=True)

    share_price_factors = Dict(
        {},
        help="""A factor on the price of a GPU fraction, per guarantee class, e.g.
        ``{"mps": "1.25", "timeslice": "0.8"}``: a 0.5 ``mps`` share of a GPU
        priced 2 tokens/h then costs 1.25 tokens/h. Classes: ``mps`` (memory
        capped) and ``timeslice`` (shared, best effort); MIG instances have
        `mig_prices`. Default: empty (every fraction pays its share, factor 1).
        The spawn page and ``GET models`` show the prices with the factor; only
        the embedded usage source (allocation records) knows a share's class,
        so a factor other than 1 needs it.
        """,
    ).tag(config=True)

    default_price = TokenAmount(
        None,
        allow_none=True,
        minimum=Decimal(0),
        help="Price per GPU-hour for models missing from `prices`. Unset (default): an unpriced model is an error at start-up.",
    ).tag(config=True)

    initial_grant = TokenAmount(100, minimum=Decimal(0), help="Tokens a new user starts with.").tag(config=True)
    monthly_credit = TokenAmount(30, minimum=Decimal(0), help="Tokens added on the first day of each month.").tag(config=True)
    daily_credit = TokenAmount(1, minimum=Decimal(0), help="Tokens added each day.").tag(config=True)
    floor = TokenAmount(
        -10,
        maximum=Decimal(0),
        help="""Overdraft floor (zero or negative). A balance may go below zero down to
        the floor; at the floor the user's GPU servers are stopped.""",
    ).tag(config=True)
    max_balance = TokenAmount(
        None, allow_none=True, minimum=Decimal(0),
        help="Optional cap: scheduled credits never lift a balance above it (admin grants may).",
    ).tag(config=True)
    low_balance = TokenAmount(
        10, help="Below this balance the lab widget shows the 'low' state.",
    ).tag(config=True)
    min_start_hours = TokenAmount(
        1, minimum=Decimal(0),
        help="""A GPU server may start only if paying for this many hours at its price
        keeps the balance at or above the floor.""",
    ).tag(config=True)

    group_credits = Dict(
        {},
        help="""Credit rules per JupyterHub group, overriding the defaults, e.g.
        ``{"faculty": {"initial": 500, "monthly": 100}}``. Keys: initial, monthly,
        daily, floor, max_balance. A user in several groups gets, for each key,
        the most generous value among their groups that set it (largest grant,
        credit and cap; lowest floor).""",
    ).tag(config=True)

    credit_timezone = Unicode(
        "UTC", help="Time zone whose midnight starts a credit day (an IANA name such as 'Europe/Berlin')."
    ).tag(config=True)

    nodes = List(
        [],
        help="""The GPU nodes of the pool, e.g.
        ``[{"name": "node-a", "cpu_milli": 32000, "memory_mib": 131072,
        "gpus": {"count": 4, "model": "NVIDIA GeForce RTX 3090"},
        "links": [{"gpus": [0, 1], "nvlinks": 4}]}]``.
        See docs/placement.md for every key (GPU UUIDs, MIG devices, PCIe levels).""",
    ).tag(config=True)

    inventory = Unicode(
        "config",
        help="""Where the pool's nodes come from: 'config' (``c.GPUPool.nodes``), 'slurm'
        (``scontrol show node``, with ``slurm_gpu_models``; refreshed while the service runs: nodes
        Slurm will not schedule on take no placements, GPUs held by jobs the hub did not start are
        held outside the hub; see docs/slurm.md) or 'agents' (what the node agents report: a node
        joins when its agent reports and takes no new placements while its agent is silent for
        ``agent_timeout``; needs ``c.GPUPoolService.agent_tokens``).""",
    ).tag(config=True)

    agent_timeout = Float(
        90,
        help="""Seconds without a call from a node's agent after which the node takes no new
        placements (inventory 'agents'); its servers keep their GPUs, and it takes placements again
        when its agent calls. Agents call every ``GPUPoolAgent.interval`` (15 s): keep this several
        times that.""",
    ).tag(config=True)

    unix_uid_min = Integer(
        help="""The lowest uid of an account that may run a user's server (localprocess, systemd, Slurm
        spawners); others, e.g. ``root``, ``daemon``, ``nobody``, get 403 before anything is held, charged
        or run. Default: ``UID_MIN`` of the hub's ``/etc/login.defs``, else 1000, as the node agent's
        ``min_uid``. Never below 1.""",
    ).tag(config=True)
    unix_uid_max = Integer(
        help="The highest uid of an account that may run a user's server. Default: ``UID_MAX`` of "
             "``/etc/login.defs``, else 60000 (``nobody`` is 65534).",
    ).tag(config=True)
    unix_denied_names = List(
        Unicode(), default_value=sorted(SYSTEM_NAMES),
        help="""Accounts that never run a user's server, whatever their uid (in lower case, as JupyterHub's
        logins): by default the system accounts of Debian, Red Hat and the programs beside a hub
        (``gpupool_hub.identity.unix.SYSTEM_NAMES``). Add to it rather than replace it.""",
    ).tag(config=True)

    placement_policy = Unicode(
        "fgd", help="Placement policy: 'fgd' (fragmentation-aware, default), 'best-fit', 'first-fit' or 'random'.",
    ).tag(config=True)

    db_url = Unicode(
        "sqlite:///gpupool.sqlite",
        help="""SQLAlchemy URL of the ledger database. SQLite by default; for
        PostgreSQL use ``postgresql://user:password@host/dbname`` (psycopg 3).""",
    ).tag(config=True)

    db_url_file = Unicode(
        "",
        help="""Path of a file holding the ledger database's URL (its only line), read by the
        service at start-up instead of ``db_url``. Use it for PostgreSQL: the URL holds the
        password. The file must be readable by the service's Unix user alone (``chmod 600``):
        the service refuses to start with one that group or others may read. Do not pass
        the URL in the service entry's ``environment`` instead: the hub stores that in its
        own database (``jupyterhub.sqlite``), which other users may be able to read.""",
    ).tag(config=True)

    teams = Dict(
        {},
        help="""Team fair share (see docs/fairshare.md): a nominal GPU quota per team, where a
        team is a JupyterHub group, e.g. ``{"vision": {"gpus": 20},
        "nlp": {"gpus": 20, "models": {"A100": 8}}}``. Within quota a server is
        guaranteed; above it a team borrows idle GPUs, which are reclaimed (the
        borrowed servers stopped) when a team under its quota needs them. Users in
        no team count against `default_team`; a user in several teams against the
        one with the most headroom left. Empty (default): no quotas, nothing is
        ever borrowed or preempted.""",
    ).tag(config=True)

    default_team = Unicode(
        "default",
        help="""Team of users in none of `teams`. Its quota is 0 GPUs (everything it
        runs is borrowed) unless `teams` has an entry of this name.""",
    ).tag(config=True)

    preempt_grace = Float(
        30, help="Seconds a borrowed server is warned before it is stopped to reclaim its GPUs.",
    ).tag(config=True)

    preempt_cooldown = Float(
        600, help="""Seconds after a team was preempted during which it may not preempt anyone itself;
        also how long a preempted (user, server) is not preempted again when it restarts
        on borrowed GPUs. Both are derived from the audit log, so a restart keeps them.""",
    ).tag(config=True)

    preempt_min_runtime = Float(
        300, help="""Seconds a borrowed server runs before it may be preempted: a younger one is
        never chosen as a victim, so a server is not stopped moments after it started.""",
    ).tag(config=True)

    # ---- the wait queue and idle reclaim (docs/admin-guide.md, "When GPUs are scarce")

    queue_enabled = Bool(
        True, help="""When a GPU server finds no room, queue it (fair order, position and estimate on
        the spawn page) instead of refusing it at once.""",
    ).tag(config=True)
    max_wait = Float(3600, help="Seconds a server may wait in the queue before it is refused.").tag(config=True)
    queue_poll_timeout = Float(
        60, help="""Seconds without a retry from the waiting spawner (it retries every few seconds)
        after which its place is given up: the user left or cancelled.""",
    ).tag(config=True)
    max_waiting_per_user = Integer(
        2, help="""How many servers one user may have waiting in the queue at once (1-1000). A spawn
        past it is refused at once (``queue_limit``), naming the servers that wait; so is one
        user's flood of named servers, which would otherwise fill the queue.""",
    ).tag(config=True)
    expected_session_hours = Float(
        4, help="Typical length of a GPU session, for wait estimates when nothing better is known.",
    ).tag(config=True)
    idle_threshold = Float(
        0.05, help="A GPU whose utilization (0-1) stays below this is idle.",
    ).tag(config=True)
    idle_after = Float(3600, help="Seconds a server's GPUs must stay idle before it counts as idle.").tag(config=True)
    idle_grace = Float(
        900, help="Seconds between the idle warning (shown in the lab widget) and the stop of the server.",
    ).tag(config=True)
    max_idle = Float(
        0, help="Optional: stop a GPU server idle this many seconds even when nobody waits. 0 = off.",
    ).tag(config=True)
    min_runtime = Float(900, help="Seconds a new server is never reclaimed as idle.").tag(config=True)
    idle_reclaim = Bool(True, help="Run the idle reclaim job at all.").tag(config=True)
    idle_dry_run = Bool(False, help="Only log and audit what idle reclaim would do.").tag(config=True)

    @default("unix_uid_min")
    def _default_uid_min(self) -> int:
        return ordinary_uid_range()[0]

    @default("unix_uid_max")
    def _default_uid_max(self) -> int:
        return ordinary_uid_range()[1]

    def account_rule(self) -> AccountRule:
        """Which accounts may run a user's server (``gpupool_hub.identity.unix``); TraitError for a bad range."""
        try:
            return AccountRule.of(self.unix_uid_min, self.unix_uid_max, self.unix_denied_names)
        except ValueError as e:
            raise TraitError(str(e)) from None

    @validate("teams")
    def _check_teams(self, proposal: Any) -> dict:  # type: ignore[type-arg]
        from .fairshare import Teams

        try:
            Teams.from_config(proposal["value"])
        except ValueError as e:
            raise TraitError(str(e)) from None
        _check_names(proposal["value"], "c.GPUPool.teams: team")
        return proposal["value"]

    @validate("default_team")
    def _check_default_team(self, proposal: Any) -> str:
        if not proposal["value"].strip():
            raise TraitError("c.GPUPool.default_team must be a non-empty group name")
        _check_names([proposal["value"]], "c.GPUPool.default_team: team")
        return proposal["value"]

    @validate("preempt_grace", "preempt_cooldown", "preempt_min_runtime")
    def _check_preempt_times(self, proposal: Any) -> float:
        name = proposal["trait"].name
        if not 0 <= proposal["value"] <= 86400:
            raise TraitError(f"c.GPUPool.{name} must be between 0 and 86400 seconds, got {proposal['value']!r}")
        return proposal["value"]

    @validate("max_waiting_per_user")
    def _check_max_waiting(self, proposal: Any) -> int:
        if not 1 <= proposal["value"] <= 1000:
            raise TraitError(f"c.GPUPool.max_waiting_per_user must be from 1 to 1000, got {proposal['value']!r}")
        return proposal["value"]

    @validate("prices")
    def _check_prices(self, proposal: Any) -> dict:  # type: ignore[type-arg]
        try:
            PriceTable.from_config(proposal["value"])
        except PricingError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    @validate("mig_prices", "share_price_factors")
    def _check_price_dicts(self, proposal: Any) -> dict:  # type: ignore[type-arg]
        parse = parse_mig_prices if proposal["trait"].name == "mig_prices" else parse_share_factors
        try:
            parse(proposal["value"])
        except PricingError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    @validate("group_credits")
    def _check_groups(self, proposal: Any) -> dict:  # type: ignore[type-arg]
        _check_names(proposal["value"], "c.GPUPool.group_credits: group")
        for group, values in proposal["value"].items():
            if not isinstance(values, dict):
                raise TraitError(f"c.GPUPool.group_credits[{group!r}] must be a dict, got {values!r}")
            try:
                CreditRules.from_config(values, where=f"c.GPUPool.group_credits[{group!r}]")
            except ValueError as e:
                raise TraitError(str(e)) from None
        return proposal["value"]

    @validate("nodes")
    def _check_nodes(self, proposal: Any) -> list:  # type: ignore[type-arg]
        from .placement import load_nodes

        try:
            nodes = load_nodes(proposal["value"])
        except ValueError as e:
            raise TraitError(f"c.GPUPool.nodes: {e}") from None
        for i, node in enumerate(nodes):  # the same names a node's agent may report (openapi.json's Name)
            _check_names([node.name], f"c.GPUPool.nodes[{i}].name: node")
            _check_names({g.model for g in node.gpus}, f"c.GPUPool.nodes[{i}].gpus: GPU model")
        return proposal["value"]

    @validate("placement_policy")
    def _check_policy(self, proposal: Any) -> str:
        from .placement import policy_names

        if proposal["value"] not in policy_names():
            raise TraitError(
                f"c.GPUPool.placement_policy: unknown policy {proposal['value']!r}; choose one of {policy_names()}"
            )
        return proposal["value"]

    @validate("credit_timezone")
    def _check_tz(self, proposal: Any) -> str:
        try:
            ZoneInfo(proposal["value"])
        except (ZoneInfoNotFoundError, ValueError):
            raise TraitError(f"c.GPUPool.credit_timezone: unknown time zone {proposal['value']!r}") from None
        return proposal["value"]

    @default("group_credits")
    def _default_groups(self) -> dict:  # type: ignore[type-arg]
        return {}

    # ---- derived objects (pure; built from the validated traits)

    @validate("inventory")
    def _check_inventory(self, proposal: Any) -> str:
        sources = inventory_sources()
        if proposal["value"] not in sources:
            raise TraitError(f"c.GPUPool.inventory: unknown source {proposal['value']!r}; choose one of "
                             f"{sorted(sources)}")
        return proposal["value"]

    @validate("agent_timeout")
    def _check_agent_timeout(self, proposal: Any) -> float:
        if not proposal["value"] > 0:
            raise TraitError(f"c.GPUPool.agent_timeout must be a positive number of seconds, got {proposal['value']!r}")
        return proposal["value"]

    def team_table(self):  # type: ignore[no-untyped-def]
        from .fairshare import Teams

        return Teams.from_config(self.teams, self.default_team)

    def price_table(self) -> PriceTable:
        return PriceTable.from_config(self.prices, self.default_price, mig_prices=self.mig_prices,
                                      share_factors=self.share_price_factors)

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.credit_timezone)

    def base_rules(self) -> CreditRules:
        return CreditRules(
            initial=self.initial_grant, monthly=self.monthly_credit, daily=self.daily_credit,
            floor=self.floor, max_balance=self.max_balance,
        )

    def rules_for(self, groups: list[str] | set[str] | tuple[str, ...] = ()) -> CreditRules:
        overrides = {}
        for group, values in self.group_credits.items():
            parsed = CreditRules.from_config(values, where=f"c.GPUPool.group_credits[{group!r}]")
            overrides[group] = {key: getattr(parsed, key) for key in values}
        return rules_for_groups(self.base_rules(), overrides, groups)


#: the settings :func:`account_rule_from_config` reads
_ACCOUNT_TRAITS = ("unix_uid_min", "unix_uid_max", "unix_denied_names")


def account_rule_from_config(config: Any) -> AccountRule:
    """The :class:`AccountRule` of ``c.GPUPool`` in a hub's configuration, for the spawners.

    Only the three account settings are loaded (a mistake elsewhere in ``c.GPUPool`` is the service's
    to report at its start, not every spawn's); a bad one is a TraitError naming it.
    """
    section = config.GPUPool if "GPUPool" in config else {}
    mine = Config({"GPUPool": {k: section[k] for k in _ACCOUNT_TRAITS if k in section}})
    return GPUPool(config=mine).account_rule()


def inventory_sources() -> list[str]:
    """The names ``c.GPUPool.inventory`` takes: the pool's own (``config``, ``agents``) and every engine's."""
    return ["config", "agents", *(e.name for e in engines() if e.inventory is not None)]


def make_inventory_source(settings: GPUPool):  # type: ignore[no-untyped-def]
    """The source ``c.GPUPool.inventory`` names: ``config`` (``c.GPUPool.nodes``), ``agents`` (the node
    agents' reports), or an engine's (``engines.Engine.inventory``). Imported here, on use: the agents'
    source builds on ``inventory/sources.py``, which therefore imports none of them."""
    if settings.inventory == "agents":
        from .inventory.agents import AgentInventory

        return AgentInventory(settings.agent_timeout)
    if settings.inventory != "config":
        return engine(settings.inventory).inventory(settings)  # type: ignore[misc]
    from .inventory.sources import ConfigInventory

    return ConfigInventory(settings.nodes)


def make_pool(settings: GPUPool, source=None):  # type: ignore[no-untyped-def]
    """The placement pool over ``source``'s nodes (default: the source ``inventory`` names)."""
    from .placement import Pool, get_policy, load_nodes

    nodes = (source or make_inventory_source(settings)).nodes()
    return Pool(load_nodes(nodes), policy=get_policy(settings.placement_policy))
