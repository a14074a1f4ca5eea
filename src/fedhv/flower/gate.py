"""A Fleet-only gate in front of a SuperLink: node hosts reach the Fleet API and nothing else.

flwr 1.42's SuperLink serves the Fleet API (SuperNodes), the Control API (``flwr run``,
``flwr supernode register / unregister / list``, ``flwr ls``, ``flwr log``, ``flwr stop``) and
the Runtime API on **one** HTTP port, told apart only by path (``/v1/fleet``, ``/v1/control``,
``/v1/runtime``); the open-source build has no account authentication and TLS checks only the
server. So any host that can reach the port and holds ``ca.crt`` could register its own node,
unregister the operator's, list runs or start one.

The recipe (docs/flower.md, "Several machines"): the SuperLink listens on 127.0.0.1 only (the
operator's ``flwr`` commands run on that host), and this gate listens on the public address
with the SuperLink's certificate, forwarding ``/v1/fleet/*`` (and ``/health``) to the SuperLink
and answering every other path with ``403``::

    python -m fedhv.flower.gate --listen 0.0.0.0:9092 --upstream 127.0.0.1:9093 \\
        --certfile server.pem --keyfile server.key --upstream-ca ca.crt

Requests are forwarded whole (bodies are protobuf messages of at most a model's size), with the
method, path, query, body and the headers that carry the request's meaning (content type,
SuperNode authentication's signature headers); responses come back with their status, body and
content type. While the SuperLink cannot be reached (a restart) the gate answers ``502 Bad
Gateway``, which Flower's SuperNodes retry, as they retry a refused connection.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

#: Paths a node host may use (everything a SuperNode sends).
ALLOWED_PREFIXES: tuple[str, ...] = ("/v1/fleet/",)
ALLOWED_PATHS: frozenset[str] = frozenset({"/health"})
#: Request headers not forwarded (hop-by-hop, or set by the forwarding client itself).
DROPPED_HEADERS = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding",
                             "upgrade", "te", "trailer", "proxy-authorization", "proxy-authenticate"})


def allowed(path: str) -> bool:
    """Whether a node host may use ``path`` (the Fleet API only)."""
    return path in ALLOWED_PATHS or path.startswith(ALLOWED_PREFIXES)


def make_app(upstream: str, upstream_ca: str | None = None, timeout_s: float = 600.0) -> Any:
    """The gate as an ASGI application forwarding allowed requests to ``upstream`` (``host:port``;
    ``https`` verified against ``upstream_ca`` when given, else plain ``http``)."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    scheme = "https" if upstream_ca else "http"
    client = httpx.AsyncClient(base_url=f"{scheme}://{upstream}", verify=upstream_ca or False, timeout=timeout_s)

    async def forward(request: Request) -> Response:
        path = request.url.path
        if not allowed(path):
            return Response(f"{path}: not served here; this address forwards the Fleet API only (the operator uses "
                            "the SuperLink's own address)\n", status_code=403, media_type="text/plain")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED_HEADERS}
        try:
            reply = await client.request(request.method, path, params=request.query_params,
                                         content=await request.body(), headers=headers)
        except httpx.TransportError as exc:  # the SuperLink is down (restarting): 502, which SuperNodes retry
            return Response(f"the SuperLink at {upstream} is not reachable ({type(exc).__name__})\n", status_code=502,
                            media_type="text/plain")
        keep = {k: v for k, v in reply.headers.items() if k.lower() not in DROPPED_HEADERS | {"content-encoding"}}
        return Response(reply.content, status_code=reply.status_code, headers=keep)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await client.aclose()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="forward only the Fleet API of a SuperLink (node hosts' address)")
    parser.add_argument("--listen", required=True, help="host:port node hosts connect to (e.g. 0.0.0.0:9092)")
    parser.add_argument("--upstream", required=True, help="the SuperLink's own host:port (e.g. 127.0.0.1:9093)")
    parser.add_argument("--certfile", help="TLS certificate to serve (the SuperLink's); without it: plain HTTP")
    parser.add_argument("--keyfile", help="its private key")
    parser.add_argument("--upstream-ca", help="CA certificate of an upstream SuperLink that serves TLS")
    args = parser.parse_args(argv)
    if bool(args.certfile) != bool(args.keyfile):
        parser.error("--certfile and --keyfile go together")
    host, _, port = args.listen.rpartition(":")
    import uvicorn

    uvicorn.run(make_app(args.upstream, args.upstream_ca), host=host, port=int(port), log_level="warning",
                ssl_certfile=args.certfile, ssl_keyfile=args.keyfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
