"""A small TLS reverse proxy for interoperability tests, run as its own process.

``python -m tests.support.http_proxy --upstream URL --cacert CA --port P [--cert C --key K]
[--hide PATH ...] [--bearer TOKEN]`` forwards every request to the daemon at ``URL`` (over TLS,
trusting ``CA``) and streams the answer back (event streams included). It listens with TLS when
given ``--cert``/``--key``, else in plain HTTP on loopback, like a local gateway. The client's
``Host`` and ``Origin`` reach the daemon unchanged. ``--hide`` answers ``404`` for a path, as a
server without it would (an mcpd from before Streamable HTTP); ``--bearer`` adds an
``Authorization`` header, as a deployment's gateway would for a client that has no option for one.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import _free_port

if TYPE_CHECKING:
    from tests.conftest import Daemon

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


def build(upstream: str, cacert: str, hide: list[str], bearer: str | None) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, verify=ssl.create_default_context(cafile=cacert),
                               timeout=httpx.Timeout(30, read=None))

    async def forward(request: Request) -> Response:
        if request.url.path in hide:
            return PlainTextResponse("not found", status_code=404)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if bearer:
            headers["authorization"] = f"Bearer {bearer}"
        body = await request.body()
        req = client.build_request(request.method, request.url.path, params=request.query_params,
                                   headers=headers, content=body)
        resp = await client.send(req, stream=True)

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in resp.aiter_raw():
                yield chunk

        out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(chunks(), status_code=resp.status_code, headers=out,
                                 background=BackgroundTask(resp.aclose))

    methods = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--cacert", required=True)
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hide", action="append", default=[])
    p.add_argument("--bearer")
    a = p.parse_args()
    app = build(a.upstream, a.cacert, a.hide, a.bearer)
    uvicorn.run(app, host="127.0.0.1", port=a.port, ssl_certfile=a.cert, ssl_keyfile=a.key, log_level="warning",
                lifespan="off")


if __name__ == "__main__":
    main()


def start(d: Daemon, hide: tuple[str, ...] = (), bearer: str | None = None, plain: bool = False,
          port: int | None = None) -> tuple[str, subprocess.Popen[bytes]]:
    """Run the proxy in front of daemon ``d`` (with ``d``'s own certificate unless ``plain``) on
    ``port`` (default: a free one); return its URL and process (the caller terminates it)."""
    cfg = yaml.safe_load(d.config_path.read_text())
    port = port or _free_port()
    args = [sys.executable, "-m", "tests.support.http_proxy", "--upstream", d.url, "--cacert", d.cacert,
            "--port", str(port)]
    if not plain:
        args += ["--cert", cfg["tls"]["cert"], "--key", cfg["tls"]["key"]]
    for path in hide:
        args += ["--hide", path]
    if bearer:
        args += ["--bearer", bearer]
    proc = subprocess.Popen(args, cwd=str(Path(__file__).resolve().parents[2]))
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("proxy did not start") from None
            time.sleep(0.05)
    return f"{'http' if plain else 'https'}://127.0.0.1:{port}", proc
