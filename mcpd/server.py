"""``mcpd serve``: run the front over TLS (SPEC §1.1) until SIGTERM/SIGINT.

:class:`Server` only starts, runs and shuts down (uvicorn's own signal handlers set its exit flag);
:func:`serve` loads the config and returns the process exit code: 0 after a clean shutdown,
:data:`mcpd.config.EXIT_CONFIG` (78) when the configuration or TLS material is broken, so systemd
does not restart it. ``python -m mcpd.server --config FILE`` does the same.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
import sys

import uvicorn

from mcpd.app import build_app
from mcpd.auth import FileAuthenticator
from mcpd.config import EXIT_CONFIG, Config, ConfigError, load
from mcpd.privileged import PrivilegedBackend, Unavailable
from mcpd.protocol import Dispatcher
from mcpd.transport.sse import SessionManager
from mcpd.worker import LocalSpawner, WorkerPool

log = logging.getLogger("mcpd.server")

GRACEFUL_SHUTDOWN_SECONDS = 5.0


def tls_context(cfg: Config) -> ssl.SSLContext:
    """The listener's server context: TLS 1.2 minimum, certificate and key from ``cfg.tls`` (SPEC §1.1).

    Raises:
        ConfigError: the certificate or key cannot be loaded.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.tls.cert, cfg.tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls: cannot load certificate/key: {exc}") from exc
    return ctx


def _privileged_backend(cfg: Config) -> PrivilegedBackend:
    """The backend for ``privileged: true`` calls (SPEC §4.1).

    The root helper client (``mcpd/helper/client.py``) plugs in here once it exists; until then
    every privileged call is ``HELPER_UNAVAILABLE``, never a downgrade.
    """
    return Unavailable()


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
            context = tls_context(self.cfg)
        except ConfigError as exc:
            log.error("%s", exc)
            return EXIT_CONFIG
        pool = WorkerPool(LocalSpawner(self.cfg.read), self.cfg)
        dispatcher = Dispatcher(pool, _privileged_backend(self.cfg))
        app = build_app(self.cfg, FileAuthenticator(self.cfg.users_file), dispatcher)
        sessions: SessionManager = app.state.sessions
        config = uvicorn.Config(
            app,
            host=self.cfg.listen.host,
            port=self.cfg.listen.port,
            ssl_certfile=self.cfg.tls.cert,
            ssl_keyfile=self.cfg.tls.key,
            lifespan="off",
            access_log=False,
            server_header=False,
            proxy_headers=False,
            log_config=None,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        )
        config.load()
        config.ssl = context  # same files, plus the TLS 1.2 floor uvicorn has no option for
        server = uvicorn.Server(config)
        try:
            await server.serve()
        finally:
            sessions.close_all()
            await pool.close()
        return 0 if server.started else 1


def serve(config_path: str) -> int:
    """Load ``config_path`` and run the front; return the exit code (78 for a broken config)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load(config_path)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)
        return EXIT_CONFIG
    return asyncio.run(Server(cfg).run())


def main(argv: list[str] | None = None) -> int:
    """``python -m mcpd.server --config FILE``."""
    parser = argparse.ArgumentParser(prog="mcpd.server", description="Run the mcpd front over TLS.")
    parser.add_argument("--config", required=True, help="path of mcpd.yaml")
    ns = parser.parse_args(argv)
    return serve(ns.config)


if __name__ == "__main__":
    sys.exit(main())
