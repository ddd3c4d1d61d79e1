"""Prometheus metrics and a health check on a listener of their own (off by default).

``metrics_listen: "127.0.0.1:9109"`` in ``mcpd.yaml`` serves, over plain HTTP on that loopback
address only (never on the TLS listener agents use):

- ``GET /metrics``: the Prometheus text format (prometheus-client), with
  ``mcpd_calls_total{tool,route,code}`` and ``mcpd_call_seconds{tool,route}`` (every tools/call and
  resources/read, counted where the access record is written), ``mcpd_sessions{transport}``,
  ``mcpd_workers`` and ``mcpd_workers_busy`` (the worker pool's size), ``mcpd_workers_started_total``
  (workers started since the front started: each timed-out or crashed call, and each cancelled one
  still running after the cancel grace, costs one),
  ``mcpd_pool_queued`` (calls waiting for a worker), ``mcpd_outgoing_bytes`` (outgoing messages held
  for clients that have not read them yet: queued, being written, in the connections' buffers),
  ``mcpd_helper_up`` (1 while the policy process answers), ``mcpd_logins_refused_total``, and
  ``mcpd_limits_hit_total{limit}``: every time one of the front's caps turned something away (the
  kinds are :data:`LIMIT_KINDS`, each exported from the start at 0);
- ``GET /healthz``: readiness, for load balancers and monitors: ``200 ok`` while the front can
  serve, ``503`` with ``Retry-After`` and a line per thing missing while it cannot: with the
  helper unit configured, while its policy process (which checks every token and has root start
  every worker) does not answer (``mcpd_helper_up`` 0).

The names ``mcpd_helper_up`` and the ``helper_connections`` limit are public (dashboards and
alerts use them) and name the helper unit as a whole; only their help texts say the process.

Metrics never carry a path, a token or a principal's name: labels are tool names, routes and
result codes only, so their number stays small.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mcpd.common.validate import digits

REGISTRY = CollectorRegistry()
CALLS = Counter("mcpd_calls", "Tool calls and resource reads, by tool, route and result code",
                ["tool", "route", "code"], registry=REGISTRY)
CALL_SECONDS = Histogram("mcpd_call_seconds", "Time to answer a call, in seconds", ["tool", "route"],
                         registry=REGISTRY, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                      5, 10, 30))
LOGINS_REFUSED = Counter("mcpd_logins_refused", "Password logins refused (401) or turned away (429)", ["status"],
                         registry=REGISTRY)
LOGINS_REFUSED.labels("401")
LOGINS_REFUSED.labels("429")

#: Every cap the front enforces, as the ``limit`` label of ``mcpd_limits_hit_total``:
#: connections (``connections.max_total``, ``max_per_address``; a client too slow with its headers or
#: body), request bodies (``max_body_bytes``), sessions (``max_sessions``,
#: ``max_sessions_per_principal``), requests in flight per session (``max_in_flight``), batch
#: members (``max_batch``), a client that stopped reading (its session's outgoing queue, or one
#: POST's stream, overflowed; or the outgoing bytes of its principal, ``principal_queue_bytes``, or
#: of all, ``total_queue_bytes``, would pass their budget), privileged calls in flight per principal
#: (``max_privileged_per_principal``), unprivileged calls per principal (``max_calls_per_principal``),
#: batch members whose reply would pass the batch's bytes (``session_queue_bytes``), daily quotas (``limits``), logins in flight (429), a
#: call that waited past its deadline for a worker (``workers.max_accounts`` or ``per_account``) or
#: for one of the front's connections to the policy process (``helper_connections``: all held, or the
#: principal's share of them), and a call that needed a new worker past its principal's
#: ``workers.spawn_burst``/``spawns_per_second`` (``worker_spawns``), and a task asked for past its
#: principal's ``tasks.max_per_principal`` (``tasks_per_principal``), and a privileged call that
#: would wait for a person past the waits of its principal or of all (``approval_waits``).
LIMIT_KINDS = (
    "connections_total", "connections_per_address", "header_deadline", "body_deadline", "body_bytes",
    "sessions_total", "sessions_per_principal", "in_flight", "batch", "queue_overflow",
    "privileged_per_principal", "requests_per_day", "logins_in_flight", "worker_accounts", "account_workers",
    "calls_per_principal", "batch_bytes", "header_bytes", "helper_connections", "worker_spawns",
    "queue_bytes_per_principal", "queue_bytes_total", "tasks_per_principal", "approval_waits",
)
LIMITS_HIT = Counter("mcpd_limits_hit", "Requests, connections or sessions turned away by one of the front's caps",
                     ["limit"], registry=REGISTRY)
for _kind in LIMIT_KINDS:
    LIMITS_HIT.labels(_kind)

WORKERS_STARTED = Counter("mcpd_workers_started", "Worker processes started", registry=REGISTRY)
SESSIONS_EVICTED = Counter("mcpd_sessions_evicted", "Idle Streamable HTTP sessions closed to make room for a new "
                           "session at a full cap (mcp_session_evict_seconds)", registry=REGISTRY)


def session_evicted() -> None:
    """Count one idle session closed to make room for a new one."""
    SESSIONS_EVICTED.inc()


def worker_started() -> None:
    """Count one worker process started by the pool."""
    WORKERS_STARTED.inc()


def limit_hit(kind: str) -> None:
    """Count one thing turned away by cap ``kind`` (one of :data:`LIMIT_KINDS`)."""
    LIMITS_HIT.labels(kind).inc()


_CALL_SERIES: dict[tuple[str, str, str], tuple[Any, Any]] = {}  # (tool, route, code) → its two series
_CALL_SERIES_MAX = 1024


def observe_call(tool: str, route: str, code: str, seconds: float) -> None:
    """Count one finished call: ``route`` is ``unprivileged``, ``forwarded`` (privileged) or
    ``refused`` (before any route); ``code`` is ``ok`` or the error code; ``seconds`` its time.
    The labelled series are looked up once per label set (at most :data:`_CALL_SERIES_MAX` kept)."""
    key = (tool, route, code)
    series = _CALL_SERIES.get(key)
    if series is None:
        series = (CALLS.labels(tool, route, code), CALL_SECONDS.labels(tool, route))
        if len(_CALL_SERIES) < _CALL_SERIES_MAX:
            _CALL_SERIES[key] = series
    series[0].inc()
    series[1].observe(seconds)


class PoolState(Protocol):
    """What the metrics read of the worker pool (:class:`mcpd.front.workers.pool.WorkerPool`)."""

    def live(self) -> int: ...

    def busy(self) -> int: ...

    def queued(self) -> int: ...


class StateCollector(Collector):
    """Gauges read at scrape time from the live front: sessions by transport, the worker pool
    (``pool``: its ``live()``, ``busy()`` and ``queued()`` counts), whether the policy process is
    up (``policy_up``; ``None``: no helper unit), and (``outgoing``, when given) the bytes of
    outgoing messages held for clients that have not read them yet, all sessions and POST streams
    together."""

    def __init__(self, sessions: Callable[[], Iterable[str]], pool: PoolState,
                 policy_up: Callable[[], bool | None], outgoing: Callable[[], int] | None = None) -> None:
        self._sessions, self._pool, self._policy_up = sessions, pool, policy_up
        self._outgoing = outgoing

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_kind: dict[str, int] = {"sse": 0, "mcp": 0}
        for kind in self._sessions():
            by_kind[kind] = by_kind.get(kind, 0) + 1
        sessions = GaugeMetricFamily("mcpd_sessions", "Open sessions by transport", labels=["transport"])
        for kind, count in sorted(by_kind.items()):
            sessions.add_metric([kind], count)
        yield sessions
        yield GaugeMetricFamily("mcpd_workers", "Live worker processes", value=self._pool.live())
        yield GaugeMetricFamily("mcpd_workers_busy", "Worker processes running a call", value=self._pool.busy())
        yield GaugeMetricFamily("mcpd_pool_queued", "Calls waiting for a worker", value=self._pool.queued())
        if self._outgoing is not None:
            yield GaugeMetricFamily("mcpd_outgoing_bytes", "Bytes of outgoing messages clients have not read yet",
                                    value=self._outgoing())
        up = self._policy_up()
        if up is not None:
            yield GaugeMetricFamily("mcpd_helper_up", "1 while the policy process (of the helper unit) answers",
                                    value=1 if up else 0)

    def missing(self) -> list[str]:
        """What the front lacks to serve now, one line each (``/healthz``); empty: ready."""
        if self._policy_up() is False:
            return [POLICY_MISSING]
        return []


#: ``/healthz``'s line while the policy process does not answer (``helper``: the unit it runs in)
POLICY_MISSING = ("helper: the policy process does not answer (it checks every token and has root start "
                  "every worker): new sessions, workers and privileged calls are refused until it is back")
HEALTH_RETRY_SECONDS = 2  # ``Retry-After`` of a 503 from /healthz


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


def parse_listen(value: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``[::1]:PORT`` for IPv6) on a loopback address.

    Raises:
        ValueError: malformed, or not a loopback address (metrics are never served to the network).
    """
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    number = digits(port) if sep else None
    if number is None or not 0 < number < 65536:
        raise ValueError(f"metrics_listen: expected HOST:PORT, got {value!r}")
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"metrics_listen: {host} is not a loopback address")
    return host, number


def serve(listen: str, collector: StateCollector) -> WSGIServer:
    """Start the metrics listener on ``listen`` in a daemon thread; returns the server (call its
    ``shutdown()`` to stop). Raises ``ValueError`` for a bad address, ``OSError`` when it cannot bind."""
    host, port = parse_listen(listen)
    REGISTRY.register(collector)
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            missing = collector.missing()
            if missing:
                start_response("503 Service Unavailable",
                               [("Content-Type", "text/plain"), ("Retry-After", str(HEALTH_RETRY_SECONDS))])
                return ["".join(f"not ready: {line}\n" for line in missing).encode()]
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        return metrics_app(environ, start_response)  # type: ignore[no-any-return]

    server = make_server(host, port, app, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
