"""``mcpd serve``: run the front over TLS (docs/REFERENCE.md §1.1) until SIGTERM/SIGINT.

:class:`Server` only starts, runs and shuts down (uvicorn's own signal handlers set its exit flag);
:func:`serve` loads the config and returns the process exit code: 0 after a clean shutdown,
:data:`mcpd.common.config.EXIT_CONFIG` (78) when the configuration or TLS material is broken, so systemd
does not restart it. ``python -m mcpd.front.server --config FILE`` does the same.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable

import uvicorn

from mcpd.common import frames, sdnotify, wirejson
from mcpd.common.config import EXIT_CONFIG, Config, ConfigError, Limits, load
from mcpd.front import metrics, tls
from mcpd.front.access import AccessLog
from mcpd.front.app import build_app
from mcpd.front.auth import Authenticator, FileAuthenticator
from mcpd.front.connections.count import ConnectionCount
from mcpd.front.connections.guarded import guarded_protocol, loop_factory
from mcpd.front.limits import LimitsTracker
from mcpd.front.login import NoLogin, PolicyLogin
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.policy_client.authenticator import PolicyAuthenticator
from mcpd.front.policy_client.backend import PolicyBackend
from mcpd.front.policy_client.channel import PolicyChannel
from mcpd.front.policy_client.spawner import PolicySpawner
from mcpd.front.privileged import PrivilegedBackend, Unavailable
from mcpd.front.resources import FileResources
from mcpd.front.revalidate import revalidate_forever
from mcpd.front.sessions.table import SessionManager
from mcpd.front.workers.pool import WorkerPool
from mcpd.front.workers.spawner import LocalSpawner, Spawner

log = logging.getLogger("mcpd.front.server")

GRACEFUL_SHUTDOWN_SECONDS = 5


def tls_context(cfg: Config) -> ssl.SSLContext:
    """A server context (:func:`mcpd.front.tls.server_context`) holding ``cfg.tls``'s certificate
    and key, checked as a reload checks them (:func:`mcpd.front.tls.read_pair`).

    Raises:
        ConfigError: the certificate or key cannot be used.
    """
    try:
        return tls.context_for(tls.read_pair(cfg.tls.cert, cfg.tls.key))
    except tls.PairError as exc:
        raise ConfigError(f"tls: cannot load certificate/key: {exc}") from exc


def _backends(cfg: Config) -> tuple[Authenticator, Spawner, PolicyChannel | None]:
    """Who authenticates tokens, starts workers and decides privileged calls (docs/PRIVSEP.md).

    With a ``helper_socket`` configured, all three go to the policy process: it alone reads
    ``users.yaml`` and decides grants (docs/REFERENCE.md §4.1), and has root start workers with
    each account's own uid and open the granted files.
    Without one (development as a normal user), the front reads ``users.yaml`` itself, workers run
    as the daemon's own user, and every privileged call is ``HELPER_UNAVAILABLE``, never a
    downgrade.
    """
    if not cfg.helper_socket:
        return FileAuthenticator(cfg.users_file), LocalSpawner(cfg.read), None
    channel = PolicyChannel(cfg.helper_socket, frames.reply_cap(cfg.read.response_cap))
    return PolicyAuthenticator(channel, cfg.auth_cache_seconds, oauth=cfg.oauth.enabled), PolicySpawner(channel), channel


class _NotifyingServer(uvicorn.Server):
    """uvicorn's server that tells systemd ``READY=1`` once the listener is up (``Type=notify``)."""

    on_shutdown: tuple[Callable[[], None], ...] = ()
    before_shutdown: tuple[Callable[[], None], ...] = ()  # e.g. closing the sessions, which ends their streams

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            sdnotify.notify()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, then :attr:`on_shutdown` (uvicorn re-raises the stop signal when
        ``serve`` returns, so work after ``serve`` may never run). :attr:`before_shutdown` runs
        first: uvicorn waits for open connections, and a session's stream ends only when it closes."""
        for hook in self.before_shutdown:
            hook()
        await super().shutdown(sockets)
        for hook in self.on_shutdown:
            hook()


POLICY_PROBE_SECONDS = 1.0


async def _probe_forever(channel: PolicyChannel) -> None:
    """With metrics on: ask the policy process for one answer every :data:`POLICY_PROBE_SECONDS`
    (:meth:`PolicyChannel.probe`), so ``mcpd_helper_up`` and ``/healthz`` say whether it answers
    now rather than whether a call happened to need it."""
    while True:
        await channel.probe()
        await asyncio.sleep(POLICY_PROBE_SECONDS)


def _reload_on_hangup(certificate: tls.LiveCertificate) -> bool:
    """Make SIGHUP reload the certificate and key (``systemctl reload mcpd``), unless this process
    already handles SIGHUP itself (``mcpd dev`` runs the front in its own process and stops on a
    hang-up); True when the handler was installed."""
    if signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN):
        return False
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, certificate.reload, "SIGHUP")
    return True


class Server:
    """The front process: worker pool, sessions and uvicorn over TLS.

    Args:
        cfg: a validated :class:`Config`.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    async def run(self) -> int:
        """Serve until a shutdown signal; return the exit code (0, or 78 for broken TLS material)."""
        try:
            certificate = tls.LiveCertificate(self.cfg.tls.cert, self.cfg.tls.key, self.cfg.state_dir)
        except tls.PairError as exc:
            log.error("tls: cannot load certificate/key: %s", exc)
            return EXIT_CONFIG
        authenticator, spawner, channel = _backends(self.cfg)
        pool = WorkerPool(spawner, self.cfg)
        backend: PrivilegedBackend = Unavailable() if channel is None else \
            PolicyBackend(channel, pool, timeout=self.cfg.workers.timeout_seconds,
                          per_principal=self.cfg.max_privileged_per_principal)
        resources = FileResources(pool, backend, self.cfg.workspaces, self.cfg.default_workspace)
        dispatcher = Dispatcher(pool, backend, resources=resources, tool_names=self.cfg.tool_names)
        dispatcher.max_in_flight, dispatcher.max_batch = self.cfg.max_in_flight, self.cfg.max_batch
        dispatcher.max_batch_bytes = self.cfg.session_queue_bytes
        t = self.cfg.tasks
        dispatcher.tasks.configure(t.max_per_principal, t.default_ttl_seconds, t.max_ttl_seconds,
                                   t.poll_interval_seconds, t.max_result_bytes)
        login = PolicyLogin(channel) if channel is not None else NoLogin()
        if self.cfg.limits != Limits():
            dispatcher.limits = resources.limits = LimitsTracker(self.cfg.limits, self.cfg.state_dir)
        if self.cfg.access_log:
            try:
                dispatcher.access = resources.access = AccessLog(self.cfg.access_log, self.cfg.audit.writer_args())
            except OSError as exc:  # every call must leave a record: no log, no service
                log.error("access_log: cannot open %s: %s (its folder must exist and be the service user's own, "
                          "0700: install -d -m 0700 -o %s %s)", self.cfg.access_log, exc, self.cfg.service_user,
                          os.path.dirname(self.cfg.access_log))
                return EXIT_CONFIG
        try:
            app = build_app(self.cfg, authenticator, dispatcher, login)
        except ConfigError as exc:
            log.error("%s", exc)
            await pool.close()
            return EXIT_CONFIG
        sessions: SessionManager = app.state.sessions
        config = uvicorn.Config(
            app,
            host=self.cfg.listen.host,
            port=self.cfg.listen.port,
            ssl_certfile=self.cfg.tls.cert,
            ssl_keyfile=self.cfg.tls.key,
            lifespan="off",
            # the C HTTP/1.1 parser (h11 cost a seventh of the front's time per call), with the
            # connection caps and the header and body deadlines (mcpd/front/connections/guarded.py)
            http=guarded_protocol(ConnectionCount(self.cfg.connections), on_refused=metrics.limit_hit),
            timeout_keep_alive=int(max(1, self.cfg.connections.idle_seconds)),
            access_log=False,
            server_header=False,
            proxy_headers=False,
            log_config=None,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        )
        config.load()
        # same files, plus the TLS 1.2 floor uvicorn has no option for; new handshakes take the
        # pair in use at that moment (reloaded on SIGHUP or when the files change: mcpd/front/tls.py)
        config.ssl = certificate.context
        server = _NotifyingServer(config)
        server.before_shutdown = (sessions.close_all, dispatcher.tasks.close)
        if dispatcher.limits is not None:
            server.on_shutdown = (dispatcher.limits.save,)
        exporter = None
        if self.cfg.metrics_listen:
            try:
                exporter = metrics.serve(self.cfg.metrics_listen, metrics.StateCollector(
                    lambda: [s.kind for s in sessions.sessions()], pool,
                    (lambda: channel.up) if channel is not None else (lambda: None),
                    lambda: sessions.outgoing.total))
            except (ValueError, OSError) as exc:
                log.error("%s", exc)
                await pool.close()
                return EXIT_CONFIG
        probing = asyncio.create_task(_probe_forever(channel)) if exporter is not None and channel is not None \
            else None
        revalidation = asyncio.create_task(revalidate_forever(
            sessions, authenticator, idle_seconds=self.cfg.mcp_session_idle_seconds, on_revoked=pool.retire_owner))
        watching = asyncio.create_task(certificate.watch())
        hangup = _reload_on_hangup(certificate)
        try:
            await server.serve()
        finally:
            if hangup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            watching.cancel()
            revalidation.cancel()
            if probing is not None:
                probing.cancel()
            if exporter is not None:
                exporter.shutdown()
            sessions.close_all()
            if dispatcher.limits is not None:
                dispatcher.limits.save()
            await pool.close()
            if dispatcher.access is not None:
                dispatcher.access.log.close()
        return 0 if server.started else 1


#: Set to ``1`` to let the front run as root anyway. Only the test suite's plain fixture does (it
#: runs as root, with no helper unit, principals mapped to its own account and files in root's temporary
#: folders); a deployment never should.
ALLOW_ROOT_ENV = "MCPD_ALLOW_ROOT_FRONT"

ROOT_REFUSAL = (
    "mcpd serve must not run as root: the policy process refuses a front running as root (every token "
    "would be answered 401), and without the helper unit every read would have root's rights. Run the "
    "root helper as root and the front as the service user: `systemctl enable --now mcpd-helper.socket "
    "mcpd.service` (or by hand: `mcpd helper --config FILE` as root, then `runuser -u mcpd -- mcpd serve "
    "--config FILE`); for development, `mcpd dev` does both."
)


def refuse_root(euid: int | None = None) -> str | None:
    """The rule "the front never runs as root": the message to print when the effective uid
    (``euid``, default ``os.geteuid()``) is 0 and ``MCPD_ALLOW_ROOT_FRONT=1`` is not set, else ``None``."""
    if (os.geteuid() if euid is None else euid) != 0 or os.environ.get(ALLOW_ROOT_ENV) == "1":
        return None
    return ROOT_REFUSAL


def serve(config_path: str) -> int:
    """Load ``config_path`` and run the front; return the exit code: 78 for a broken config, or when
    started as root (:func:`refuse_root`; 78 so systemd does not restart it)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load(config_path)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)
        return EXIT_CONFIG
    refusal = refuse_root()
    if refusal is not None:
        log.error("%s", refusal)
        return EXIT_CONFIG
    frames.use_codec(wirejson.dumps, wirejson.loads)  # orjson for the policy process's and workers' frames
    # uvloop: its TLS transport and event loop cost a fraction of asyncio's (profiled: asyncio's
    # sslproto write path was over a quarter of the front's time per small read).
    with asyncio.Runner(loop_factory=loop_factory(cfg.connections)) as runner:
        return runner.run(Server(cfg).run())


def main(argv: list[str] | None = None) -> int:
    """``python -m mcpd.front.server --config FILE``."""
    parser = argparse.ArgumentParser(prog="mcpd.front.server", description="Run the mcpd front over TLS.")
    parser.add_argument("--config", required=True, help="path of mcpd.yaml")
    ns = parser.parse_args(argv)
    return serve(ns.config)


if __name__ == "__main__":
    sys.exit(main())
