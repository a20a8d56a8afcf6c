"""``gpupool``: the admin command line, a client of the service's REST API.

    export GPUPOOL_URL=https://hub.example.org/services/gpupool/api/v1
    export GPUPOOL_TOKEN=...      # a hub token with custom:gpupool:admin
    gpupool balance alice
    gpupool grant alice 25 --reason "thesis deadline"

Exit codes scripts can rely on: 0 success, 1 the service refused (4xx),
2 bad command line, 3 ``verify`` found mismatches, 4 the service could not be
reached or failed (5xx).

``--limit N`` is what you get: the newest N entries (or all there are), asked
for page by page, since the API serves at most one page (the ``maximum`` its
OpenAPI document gives ``limit``) per request.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from . import strictjson
from .reasons import AuditAction

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_MISMATCH, EXIT_UNREACHABLE = 0, 1, 2, 3, 4


class CLIError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Client:
    def __init__(self, url: str, token: str, timeout: float = 30) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"
        self.timeout = timeout

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            r = self.session.request(method, f"{self.url}{path}", timeout=self.timeout, **kwargs)
        except requests.RequestException as e:
            raise CLIError(f"cannot reach the gpupool service at {self.url}: {e}", EXIT_UNREACHABLE) from None
        if r.status_code >= 400:
            try:
                message = strictjson.loads(r.text).get("message", r.text)
            except ValueError:
                message = r.text[:300]
            code = EXIT_UNREACHABLE if r.status_code >= 500 else EXIT_REFUSED
            raise CLIError(f"{method} {path}: HTTP {r.status_code}: {message}", code)
        return r

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return strictjson.loads(self.request(method, path, **kwargs).text)


@functools.lru_cache(maxsize=None)
def page_max(path: str) -> int:
    """The largest ``limit`` the service's ``GET path`` serves, from the OpenAPI document
    shipped with this package (the service checks queries against the same document)."""
    spec = json.loads((Path(__file__).parent / "service" / "openapi.json").read_text(encoding="utf-8"))
    params = spec["paths"][path]["get"]["parameters"]
    return int(next(p for p in params if p.get("name") == "limit")["schema"]["maximum"])


def newest(client: Client, path: str, key: str, limit: int, **params: Any) -> list[dict[str, Any]]:
    """Up to ``limit`` items of a newest-first listing (``path`` as the API spec names it,
    ``params`` filling its ``{name}``s and queries), a page at a time: one request can ask for
    at most :func:`page_max` of them, and a bigger ``--limit`` is a request for more, not an error."""
    names = {k: params.pop(k) for k in list(params) if "{" + k + "}" in path}
    url = path.format(**{k: _u(v) for k, v in names.items()})
    items: list[dict[str, Any]] = []
    before = None
    while len(items) < limit:
        query = {**params, "limit": min(page_max(path), limit - len(items)), **({"before": before} if before else {})}
        page = client.json("GET", url, params=query)
        items += page[key]
        before = page["next_before"]
        if not before:
            break
    return items


def positive(text: str) -> int:
    """``--limit``'s type: a whole number above 0 (argparse says so, exit code 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain aligned table; numbers right-aligned so columns of amounts line up."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_number(r[i]) for r in cells[1:]) and len(cells) > 1 for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _u(name: str) -> str:
    return quote(name, safe="")


def cmd_balance(client: Client, args: argparse.Namespace) -> int:
    if args.user:
        me = client.json("GET", f"/users/{_u(args.user)}")
        if args.json:
            print(json.dumps(me, indent=2))
            return EXIT_OK
        print(f"{me['user']}: {me['balance']} tokens ({me['status']}), floor {me['floor']}, "
              f"burning {me['burn_rate_per_hour']}/h")
        for a in me["allocations"]:
            print(f"  {a['server'] or '(default)'}: {a['description']}")
        return EXIT_OK
    rows, after = [], None
    while True:
        page = client.json("GET", "/users", params={"limit": page_max("/users"), **({"after": after} if after else {})})
        rows += [(u["name"], u["balance"]) for u in page["users"]]
        after = page["next_after"]
        if not after:
            break
    print(json.dumps(rows) if args.json else table(rows, ["user", "balance"]))
    return EXIT_OK


def cmd_grant(client: Client, args: argparse.Namespace) -> int:
    key = args.idempotency_key or uuid.uuid4().hex
    result = client.json("POST", f"/users/{_u(args.user)}/grant", json={"amount": args.amount, "reason": args.reason},
                         headers={"Idempotency-Key": key})
    entry = result["entry"]
    verb = "granted" if result["created"] else "already granted (same idempotency key)"
    print(f"{verb}: {entry['amount']} to {args.user} ({entry['reason']}); balance now {result['balance']}")
    return EXIT_OK


def cmd_history(client: Client, args: argparse.Namespace) -> int:
    entries = newest(client, "/users/{name}/history", "entries", args.limit, name=args.user)
    if args.json:
        print(json.dumps(entries, indent=2))
        return EXIT_OK
    rows = [(e["created_at"], e["kind"], e["amount"], e["model"] or "", e["reason"]) for e in entries]
    print(table(rows, ["time", "kind", "amount", "model", "reason"]))
    return EXIT_OK


def _pool_holder(h: dict[str, Any], outside_index: bool) -> str:
    """One holder of a GPU for ``gpupool pool``: a server, or what the inventory source
    says holds it (a scheduler job the hub did not start, a node taking no servers)."""
    if h.get("held_outside"):
        return "held outside the hub" if outside_index else "node unavailable"
    return (f"{h['user']}/{h['server'] or '-'} ({h['fraction']})"
            + (f" idle since {h['idle_since']}" if h.get("idle_since") else ""))


def cmd_pool(client: Client, args: argparse.Namespace) -> int:
    pool = client.json("GET", "/pool")
    if args.json:
        print(json.dumps(pool, indent=2))
        return EXIT_OK
    rows = []
    for node in pool["nodes"]:
        outside = set(node.get("held_outside") or ())
        for g in node["gpus"]:
            holders = ", ".join(_pool_holder(h, g["index"] in outside) for h in g["holders"])
            rows.append((node["node"], g["index"], g["model"], g["allocated_fraction"],
                         "MIG" if g.get("mig") else (holders or "free")))
            for m in g.get("mig", ()):  # each MIG instance on its own line, under its GPU
                who = ", ".join(f"{h['user']}/{h['server'] or '-'}"
                                + (f" idle since {h['idle_since']}" if h.get("idle_since") else "")
                                for h in m["holders"])
                rows.append(("", f"  {g['index']}/{m['profile']}", m["uuid"],
                             m["fraction"] if m["holders"] else "0.000", who or "free"))
    print(table(rows, ["node", "gpu", "model", "allocated", "holders"]))
    teams = pool.get("teams") or []
    if teams:
        print()
        print(table([(t["team"], f"{t['used_gpus']:g}", f"{t['quota_gpus']:g}", f"{t['borrowed_gpus']:g}",
                      t["servers"], t.get("cooldown_until") or "")
                     for t in teams], ["team", "used", "quota", "borrowed", "servers", "no preempting until"]))
    for node in pool["nodes"]:
        if node.get("unavailable"):
            print(f"node {node['node']} takes no new servers: {node['unavailable']}", file=sys.stderr)
        if node.get("problem"):
            print(f"node {node['node']}: {node['problem']}", file=sys.stderr)
    for finding in pool.get("unallocated_servers", []):
        print(f"warning: {finding['user']}/{finding['server']}: {finding['message']}", file=sys.stderr)
    return EXIT_OK


def cmd_queue(client: Client, args: argparse.Namespace) -> int:
    """Who waits for GPUs, in the order they will get them."""
    q = client.json("GET", "/queue")
    if args.json:
        print(json.dumps(q, indent=2))
        return EXIT_OK
    rows = [(w["position"] or "reserved", w["user"], w["server"] or "-", w["request"], w["since"],
             f"{w['waited_seconds'] // 60} min", w["eta"] or "no estimate", w["reserved_on"] or "")
            for w in q["waiting"]]
    if rows:
        print(table(rows, ["position", "user", "server", "request", "since", "waited", "estimate", "reserved on"]))
    else:  # kept nodes and the estimates' accuracy still matter: the next small spawn may wait
        print("nobody is waiting for GPUs")
    if q.get("reserved_node"):
        print(f"node {q['reserved_node']} is held for the first in line", file=sys.stderr)
    if q.get("drained_nodes"):
        print(f"drained for waiters of several GPUs: {', '.join(q['drained_nodes'])}", file=sys.stderr)
    if q.get("kept_nodes"):
        print(f"kept whole for profiles of several GPUs: {', '.join(q['kept_nodes'])}", file=sys.stderr)
    if q.get("accuracy"):
        print(f"wait estimates, {q['accuracy']['text']}", file=sys.stderr)
    return EXIT_OK


def cmd_verify(client: Client, args: argparse.Namespace) -> int:
    report = client.json("GET", "/ledger/verify")
    if report["ok"]:
        print(f"ok: {report['accounts']} accounts, {report['entries']} entries, every balance matches its entries")
        return EXIT_OK
    print(table([(m["user"], m["stored"], m["computed"]) for m in report["mismatches"]], ["user", "stored", "computed"]))
    print(f"MISMATCH in {len(report['mismatches'])} account(s)", file=sys.stderr)
    return EXIT_MISMATCH


def cmd_audit(client: Client, args: argparse.Namespace) -> int:
    """What culling and fair share did, newest first: warnings, kernel culls, stops, preemptions."""
    events = newest(client, "/audit", "events", args.limit, **({"user": args.user} if args.user else {}))
    if args.action:
        events = [e for e in events if e["action"] == args.action]
    if args.json:
        print(json.dumps(events, indent=2))
        return EXIT_OK
    rows = [(e["at"], e["user"], e["server"] or "-", e["action"] + (" (dry run)" if e["dry_run"] else ""),
             e["reason"]) for e in events]
    print(table(rows, ["time", "user", "server", "action", "reason"]))
    return EXIT_OK


def cmd_export(client: Client, args: argparse.Namespace) -> int:
    r = client.request("GET", "/ledger/export", stream=True)
    out = open(args.output, "w", newline="", encoding="utf-8") if args.output else sys.stdout
    try:
        for chunk in r.iter_content(chunk_size=65536, decode_unicode=True):
            out.write(chunk)
    finally:
        if args.output:
            out.close()
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=os.environ.get("GPUPOOL_URL"),
                   help="service API base, e.g. http://127.0.0.1:8000/services/gpupool/api/v1 (env GPUPOOL_URL)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("balance", help="one user's balance, or every balance")
    b.add_argument("user", nargs="?")
    b.set_defaults(func=cmd_balance)
    g = sub.add_parser("grant", help="grant tokens (negative to take back)")
    g.add_argument("user")
    g.add_argument("amount", help="tokens, e.g. 25 or 2.5 or -10")
    g.add_argument("--reason", required=True)
    g.add_argument("--idempotency-key", help="repeat the command with the same key and it is recorded once")
    g.set_defaults(func=cmd_grant)
    h = sub.add_parser("history", help="a user's ledger entries, newest first")
    h.add_argument("user")
    h.add_argument("--limit", type=positive, default=50, help="the newest N entries (default 50)")
    h.set_defaults(func=cmd_history)
    sub.add_parser("pool", help="the allocation map: every GPU and who holds it").set_defaults(func=cmd_pool)
    sub.add_parser("queue", help="who waits for GPUs: position, since when, estimate").set_defaults(func=cmd_queue)
    sub.add_parser("verify", help="recompute every balance from the ledger").set_defaults(func=cmd_verify)
    a = sub.add_parser("audit", help="what culling and fair share did, newest first")
    a.add_argument("--user", help="only this user's events")
    a.add_argument("--action", choices=[x.value for x in AuditAction], help="only events of this kind")
    a.add_argument("--limit", type=positive, default=50,
                   help="the newest N events, before --action picks among them (default 50)")
    a.set_defaults(func=cmd_audit)
    e = sub.add_parser("export", help="every ledger entry")
    e.add_argument("--csv", action="store_true", required=True, help="CSV (the only format)")
    e.add_argument("-o", "--output", help="file to write (default: standard output)")
    e.set_defaults(func=cmd_export)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    token = os.environ.get("GPUPOOL_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN")
    if not args.url:
        print("gpupool: set GPUPOOL_URL or --url to the service API", file=sys.stderr)
        return EXIT_USAGE
    if not token:
        print("gpupool: set GPUPOOL_TOKEN to a hub API token with the gpupool admin scope", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(Client(args.url, token), args)
    except CLIError as e:
        print(f"gpupool: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
