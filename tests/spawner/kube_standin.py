"""A stand-in for the Kubernetes API server: the pod calls KubeSpawner makes, answered on 127.0.0.1.

No API server can be installed on the test machines, so this answers what
KubeSpawner 7's ``kubernetes_asyncio`` client sends (each found by running the
spawner against it; anything else is answered 404 and kept in ``unknown``):

* ``GET /api/v1/namespaces/{ns}/pods?labelSelector=…``: the pod reflector's list;
  with ``watch=true`` its watch, one JSON ``{"type", "object"}`` line per change,
  from the list's ``resourceVersion`` on;
* ``GET /api/v1/namespaces/{ns}/events?fieldSelector=…``: the event reflector's
  list and watch (no events are made here);
* ``POST /api/v1/namespaces/{ns}/pods``: create. The body is kept as sent
  (``created``); the pod is ``Pending``, then ``Running`` with a ``podIP`` and a
  ready ``notebook`` container, each change a watch event. ``refuse`` makes the
  next creates fail with a ``Status`` of that code, as the API server answers an
  RBAC denial (403) or an invalid pod (422);
* ``GET`` / ``DELETE /api/v1/namespaces/{ns}/pods/{name}``: read, delete (a
  ``DELETED`` event). :meth:`end_pod` deletes a pod as if it ended on the node.

Every request is kept in ``requests`` as (method, path, query, body). A plain
threaded ``http.server``: it runs beside any event loop, so a test's loop is
only the spawner's.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

POD_IP = "127.0.0.1"
#: how long a created pod stays Pending before it runs (seconds)
START_DELAY = 0.2


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """The API server's error body (a ``Status``)."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class KubeStandIn:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.log: list[tuple[str, str, dict[str, Any]]] = []  # (kind, type, object); resourceVersion = index + 1
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.created: list[dict[str, Any]] = []  # pod bodies as sent
        self.deleted: list[str] = []
        self.unknown: list[str] = []
        self.refuse: tuple[int, str, str] | None = None  # (code, reason, message) for pod creates
        self.changed = threading.Condition()
        self.stopping = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="kube-standin", daemon=True)
        self.timers: list[threading.Timer] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> KubeStandIn:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        for timer in self.timers:
            timer.cancel()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig naming this server (what ``load_kube_config`` reads)."""
        return {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
                "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                "users": [{"name": "hub", "user": {"token": "standin-token"}}],
                "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "hub"}}]}

    # ------------------------------------------------------------ the cluster's side

    def _emit(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        """Record a change (caller holds ``changed``) and wake the watches."""
        obj["metadata"]["resourceVersion"] = str(len(self.log) + 1)
        self.log.append((kind, type_, json.loads(json.dumps(obj))))
        self.changed.notify_all()

    def _run(self, key: tuple[str, str]) -> None:
        with self.changed:
            pod = self.pods.get(key)
            if pod is None:
                return
            pod["status"] = {"phase": "Running", "podIP": POD_IP, "hostIP": POD_IP, "startTime": _now(),
                             "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0,
                                                    "image": c.get("image", ""), "imageID": "",
                                                    "state": {"running": {"startedAt": _now()}}}
                                                   for c in pod["spec"]["containers"]]}
            self._emit("pods", "MODIFIED", pod)

    def end_pod(self, namespace: str, name: str) -> None:
        """The pod is gone from the cluster (evicted, deleted by someone else)."""
        with self.changed:
            pod = self.pods.pop((namespace, name))
            self._emit("pods", "DELETED", pod)

    def create(self, namespace: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.created.append(body)
        if self.refuse:
            return self.refuse[0], status(*self.refuse)
        name = body["metadata"]["name"]
        with self.changed:
            if (namespace, name) in self.pods:
                return 409, status(409, "AlreadyExists", f'pods "{name}" already exists')
            pod = json.loads(json.dumps(body))
            pod["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
            pod["status"] = {"phase": "Pending"}
            self.pods[(namespace, name)] = pod
            self._emit("pods", "ADDED", pod)
            answer = json.loads(json.dumps(pod))
        timer = threading.Timer(START_DELAY, self._run, [(namespace, name)])
        self.timers.append(timer)
        timer.start()
        return 201, answer

    def delete(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        with self.changed:
            pod = self.pods.pop((namespace, name), None)
            if pod is None:
                return 404, status(404, "NotFound", f'pods "{name}" not found')
            self.deleted.append(name)
            self._emit("pods", "DELETED", pod)
            return 200, pod

    # ------------------------------------------------------------ HTTP

    def _matching(self, kind: str, namespace: str, query: dict[str, list[str]], obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        if meta.get("namespace") != namespace:
            return False
        labels = meta.get("labels") or {}
        for term in filter(None, query.get("labelSelector", [""])[0].split(",")):
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
        return True

    def _list(self, kind: str, namespace: str, query: dict[str, list[str]]) -> dict[str, Any]:
        with self.changed:
            items = [p for (ns, _), p in self.pods.items() if kind == "pods" and ns == namespace]
            items = [json.loads(json.dumps(p)) for p in items if self._matching(kind, namespace, query, p)]
            version = str(len(self.log))
        list_kind = {"pods": "PodList", "events": "EventList"}[kind]
        return {"kind": list_kind, "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": items}

    def _watch(self, handler: BaseHTTPRequestHandler, kind: str, namespace: str,
               query: dict[str, list[str]]) -> None:
        """Stream the changes after ``resourceVersion``, one JSON line each, until the client goes or
        ``timeoutSeconds`` pass (the reflector then lists and watches again)."""
        position = int(query.get("resourceVersion", ["0"])[0] or 0)
        timeout = float(query.get("timeoutSeconds", ["60"])[0])
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Connection", "close")
        handler.end_headers()
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while True:
                with self.changed:
                    while len(self.log) <= position and not self.stopping and not deadline.is_set():
                        self.changed.wait(0.2)
                    if self.stopping or deadline.is_set():
                        return
                    batch = self.log[position:]
                    position = len(self.log)
                for k, type_, obj in batch:
                    if k == kind and self._matching(kind, namespace, query, obj):
                        handler.wfile.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")
                handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            timer.cancel()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                standin.requests.append((method, parts.path, query, body))
                segs = parts.path.strip("/").split("/")
                # api / v1 / namespaces / {ns} / {kind} [/ {name}]
                if segs[:3] == ["api", "v1", "namespaces"] and len(segs) in (5, 6) \
                        and segs[4] in ("pods", "events"):
                    ns, kind, name = segs[3], segs[4], segs[5] if len(segs) == 6 else None
                    if method == "GET" and name is None:
                        if query.get("watch", [""])[0] in ("true", "1", "True"):
                            return standin._watch(self, kind, ns, query)
                        return self._answer(200, standin._list(kind, ns, query))
                    if kind == "pods" and method == "POST" and name is None:
                        return self._answer(*standin.create(ns, body))
                    if kind == "pods" and method == "DELETE" and name:
                        return self._answer(*standin.delete(ns, name))
                    if kind == "pods" and method == "GET" and name:
                        with standin.changed:
                            pod = standin.pods.get((ns, name))
                        if pod is None:
                            return self._answer(404, status(404, "NotFound", f'pods "{name}" not found'))
                        return self._answer(200, pod)
                standin.unknown.append(f"{method} {self.path}")
                self._answer(404, status(404, "NotFound", f"the stand-in does not serve {method} {parts.path}"))

            def do_GET(self) -> None:  # noqa: N802
                self._route("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._route("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._route("DELETE")

            def do_PUT(self) -> None:  # noqa: N802
                self._route("PUT")

            def do_PATCH(self) -> None:  # noqa: N802
                self._route("PATCH")

            def log_message(self, *args: object) -> None:
                pass

        return Handler
