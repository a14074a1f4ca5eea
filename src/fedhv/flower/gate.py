"""A Fleet-only gate in front of a SuperLink: node hosts reach the Fleet API and nothing else.

flwr 1.42's SuperLink serves the Fleet API (SuperNodes), the Control API (``flwr run``,
``flwr supernode register / unregister / list``, ``flwr ls``, ``flwr log``, ``flwr stop``) and
the Runtime API on **one** HTTP port, told apart only by path (``/v1/fleet``, ``/v1/control``,
``/v1/runtime``); the open-source build has no account authentication and TLS checks only the
server. So any host that can reach the port and holds ``ca.crt`` could register its own node,
unregister the operator's, list runs or start one.

The recipe (docs/flower.md, "Several machines"): the SuperLink listens on 127.0.0.1 only (the
operator's ``flwr`` commands run on that host), and this gate listens on the public address
with the SuperLink's certificate::

    python -m fedhv.flower.gate --listen 0.0.0.0:9092 --upstream 127.0.0.1:9093 \\
        --certfile server.pem --keyfile server.key --upstream-ca ca.crt

What it forwards is an allow-list (:mod:`fedhv.flower.gate_rules`): ``POST`` to the twelve exact
Fleet endpoints, matched byte for byte on the raw request target; anything else is answered by the
gate itself (400 / 403 / 405 / 411 / 413 / 408, plain text starting ``gate:``, the connection
closed) and never reaches the SuperLink. Bounds: request bodies up to ``--max-body-mb`` (the
declared length is checked before any byte is read, and the bytes are counted as they stream
through; nothing is buffered whole, in either direction), a deadline for a request's headers
(``--header-timeout``) and for its body (``--body-timeout`` plus its size at ``--min-rate-kb``),
headers of at most 16 KiB, at most ``--max-connections`` open connections and
``--max-connections-per-host`` from one address (more are closed at once). While the SuperLink
cannot be reached (a restart) the gate answers ``502 Bad Gateway``, which Flower's SuperNodes
retry, as they retry a refused connection. What this guarantees and what it does not:
docs/security.md, "The Fleet-only gate".
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fedhv.flower.gate_rules import DROPPED_RESPONSE_HEADERS, MIB, Refusal, check_headers, check_target

LOG = logging.getLogger("fedhv.flower.gate")

#: The largest body fedhv's built-in settings send: SecAgg+'s masked vector of FSMGDA on CelebA5
#: (5 rows x 11.17 M parameters of ResNet-18-GN as int64, 447 MB, one ConfigRecord). Plain
#: stages send arrays in chunks of at most 5 MiB (flwr's ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``).
DEFAULT_MAX_BODY_MB = 512
MAX_HEADER_BYTES = 16 * 1024


@dataclass(frozen=True)
class GateLimits:
    """The gate's bounds (defaults: the CLI's)."""

    max_body: int = DEFAULT_MAX_BODY_MB * MIB  #: bytes of one request body
    header_timeout: float = 10.0  #: seconds from a connection's start (or its last response) to a request's headers
    body_timeout: float = 30.0  #: seconds a body may take beyond its size at ``min_rate``; also the longest stall
    min_rate: float = 64 * 1024  #: bytes per second a long body must average
    max_connections: int = 256  #: open client connections
    max_per_host: int = 32  #: open client connections from one address
    keep_alive: int = 5  #: seconds an idle kept-alive connection stays open
    upstream_timeout: float = 600.0  #: seconds for the SuperLink's answer


class _BodyError(Exception):
    """The client's body broke a bound (status, reason) or the client went away (status 0)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class _RefusalLog:
    """One warning line per refusal, at most ``burst`` per ``window_s`` (a flood cannot fill the disk)."""

    def __init__(self, burst: int = 20, window_s: float = 10.0) -> None:
        self.burst, self.window_s = burst, window_s
        self.start, self.count, self.dropped = 0.0, 0, 0

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self.start > self.window_s:
            if self.dropped:
                LOG.warning("%d more refusals not logged", self.dropped)
            self.start, self.count, self.dropped = now, 0, 0
        self.count += 1
        if self.count <= self.burst:
            LOG.warning("%s", message)
        else:
            self.dropped += 1


def _printable(data: bytes, limit: int = 160) -> str:
    """``data`` as a short, printable, log-safe string."""
    text = ascii(data[:limit])[2:-1]
    return text + ("..." if len(data) > limit else "")


class Gate:
    """The gate as an ASGI application forwarding the Fleet API to ``upstream`` (``host:port``;
    ``https`` verified against ``upstream_ca`` when given, else plain ``http``)."""

    def __init__(self, upstream: str, upstream_ca: str | None = None, limits: GateLimits | None = None) -> None:
        self.upstream, self.upstream_ca = upstream, upstream_ca
        self.limits = limits or GateLimits()
        self.base = f"{'https' if upstream_ca else 'http'}://{upstream}"
        self.client: Any = None
        self.log_refusal = _RefusalLog()

    def _client(self) -> Any:
        import httpx

        if self.client is None:
            lim = self.limits
            self.client = httpx.AsyncClient(
                verify=self.upstream_ca or False, timeout=httpx.Timeout(lim.upstream_timeout),
                limits=httpx.Limits(max_connections=lim.max_connections, max_keepalive_connections=32))
        return self.client

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self.client is not None:
                        await self.client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":  # websockets: not part of the Fleet API
            return
        started = [False]

        async def tracked(message: dict[str, Any]) -> None:
            started[0] = True
            await send(message)

        try:
            await self._http(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback; the connection is answered
            LOG.warning("request failed: %s: %s", type(exc).__name__, str(exc)[:200])
            if not started[0]:
                await self._refuse(scope, send, Refusal(502, f"the request could not be forwarded "
                                                             f"({type(exc).__name__})"), log=False)

    async def _refuse(self, scope: dict[str, Any], send: Any, refusal: Refusal, log: bool = True) -> None:
        """Answer ``refusal`` as plain text and close the connection."""
        if log:
            client = (scope.get("client") or ("?", 0))[0]
            target = scope.get("raw_path", b"") + (b"?" + scope["query_string"] if scope.get("query_string") else b"")
            self.log_refusal(f"refused {refusal.status} {client} {scope.get('method', '?')[:16]} "
                             f"{_printable(target)}: {refusal.reason}")
        body = f"gate: {refusal.reason}\n".encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        if refusal.status == 405:
            headers.append((b"allow", b"POST"))
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        import httpx

        size = _head_size(scope)
        if size > MAX_HEADER_BYTES:  # h11 bounds an incomplete block only: one arriving whole in a read is parsed
            await self._refuse(scope, send, Refusal(431, f"request headers of {size} bytes exceed the gate's limit of "
                                                         f"{MAX_HEADER_BYTES} bytes"))
            return
        endpoint = check_target(scope["method"], scope.get("raw_path") or b"", scope.get("query_string", b""),
                                scope.get("path"))
        if isinstance(endpoint, Refusal):
            await self._refuse(scope, send, endpoint)
            return
        checked = check_headers(scope["headers"], self.limits.max_body)
        if isinstance(checked, Refusal):
            await self._refuse(scope, send, checked)
            return
        length, headers = checked
        headers += [("content-length", str(length)), ("accept-encoding", "identity")]
        request = self._client().build_request(scope["method"], self.base + endpoint, headers=headers,
                                               content=self._body(receive, length))
        try:
            reply = await self._client().send(request, stream=True)
        except _BodyError as exc:
            if exc.status:
                await self._refuse(scope, send, Refusal(exc.status, exc.reason))
            return
        except httpx.TransportError as exc:  # the SuperLink is down (restarting): 502, which SuperNodes retry
            cause = exc.__context__ if isinstance(exc.__context__, _BodyError) else None
            if cause is not None:  # the body broke a bound while streaming upstream
                if cause.status:
                    await self._refuse(scope, send, cause)
                return
            await self._refuse(scope, send, Refusal(502, f"the SuperLink at {self.upstream} is not reachable "
                                                         f"({type(exc).__name__})"), log=False)
            return
        try:
            keep = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.multi_items()
                    if k.lower() not in DROPPED_RESPONSE_HEADERS]
            await send({"type": "http.response.start", "status": reply.status_code, "headers": keep})
            async for chunk in reply.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await reply.aclose()

    async def _body(self, receive: Any, length: int) -> AsyncIterator[bytes]:
        """The request body as it arrives, bounded: at most ``length`` bytes (the declared, already
        checked length), within the body deadline, no stall longer than ``body_timeout``."""
        lim = self.limits
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lim.body_timeout + length / lim.min_rate
        received = 0
        more = True
        while more:
            remaining = min(deadline - loop.time(), lim.body_timeout)
            if remaining <= 0:
                raise _BodyError(408, "the request body did not arrive in time")
            try:
                message = await asyncio.wait_for(receive(), remaining)
            except TimeoutError:
                raise _BodyError(408, "the request body did not arrive in time") from None
            if message["type"] != "http.request":
                raise _BodyError(0, "client disconnected")
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > length or received > lim.max_body:
                raise _BodyError(413, f"body longer than declared or than the limit of {lim.max_body} bytes")
            more = bool(message.get("more_body"))
            if chunk:
                yield chunk
        if received != length:
            raise _BodyError(0, "client disconnected before the end of its body")


def _head_size(scope: dict[str, Any]) -> int:
    """The bytes of a parsed request's head: its request line and header lines with their CRLFs."""
    target = len(scope.get("raw_path") or b"") + (1 + len(scope["query_string"]) if scope.get("query_string") else 0)
    line = len(scope.get("method", "")) + 1 + target + len(" HTTP/1.1\r\n")
    return line + sum(len(name) + 2 + len(value) + 2 for name, value in scope.get("headers", ())) + 2


def make_app(upstream: str, upstream_ca: str | None = None, limits: GateLimits | None = None) -> Gate:
    """The gate as an ASGI application (see :class:`Gate`)."""
    return Gate(upstream, upstream_ca, limits)


def protocol_class(limits: GateLimits) -> type:
    """uvicorn's h11 protocol with the gate's connection bounds: a connection over
    ``max_connections`` (or over ``max_per_host`` from one address) is closed at once, and one
    whose request headers are not complete within ``header_timeout`` (from its start, or from the
    end of its previous response) is closed."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GateProtocol(H11Protocol):  # type: ignore[misc]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            host = self.client[0] if self.client else None
            same = sum(1 for other in self.connections if other.client and other.client[0] == host)
            if len(self.connections) > limits.max_connections or same > limits.max_per_host:
                transport.abort()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(limits.header_timeout, self._header_expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_expired(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.abort()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GateProtocol


def _positive(kind: type, name: str) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{name} {text!r}: give a finite number > 0")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="forward only the Fleet API of a SuperLink (node hosts' address)")
    parser.add_argument("--listen", required=True, help="host:port node hosts connect to (e.g. 0.0.0.0:9092)")
    parser.add_argument("--upstream", required=True, help="the SuperLink's own host:port (e.g. 127.0.0.1:9093)")
    parser.add_argument("--certfile", help="TLS certificate to serve (the SuperLink's); without it: plain HTTP")
    parser.add_argument("--keyfile", help="its private key")
    parser.add_argument("--upstream-ca", help="CA certificate of an upstream SuperLink that serves TLS")
    d = GateLimits()
    parser.add_argument("--max-body-mb", type=_positive(float, "--max-body-mb"), default=DEFAULT_MAX_BODY_MB,
                        help=f"largest request body in MiB (default {DEFAULT_MAX_BODY_MB}: the largest message of "
                             "fedhv's built-in settings; plain stages need 6)")
    parser.add_argument("--header-timeout", type=_positive(float, "--header-timeout"), default=d.header_timeout,
                        help=f"seconds for a request's headers to arrive (default {d.header_timeout:g})")
    parser.add_argument("--body-timeout", type=_positive(float, "--body-timeout"), default=d.body_timeout,
                        help=f"seconds a body may take beyond its size at --min-rate-kb, and the longest stall "
                             f"(default {d.body_timeout:g})")
    parser.add_argument("--min-rate-kb", type=_positive(float, "--min-rate-kb"), default=d.min_rate / 1024,
                        help=f"KiB/s a long body must average (default {d.min_rate / 1024:g})")
    parser.add_argument("--max-connections", type=_positive(int, "--max-connections"), default=d.max_connections,
                        help=f"open client connections (default {d.max_connections}; a SuperNode holds 1-2)")
    parser.add_argument("--max-connections-per-host", type=_positive(int, "--max-connections-per-host"),
                        default=d.max_per_host, help=f"open connections from one address (default {d.max_per_host})")
    args = parser.parse_args(argv)
    if bool(args.certfile) != bool(args.keyfile):
        parser.error("--certfile and --keyfile go together")
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen {args.listen!r}: give host:port, e.g. 0.0.0.0:9092")
    limits = GateLimits(max_body=int(args.max_body_mb * MIB), header_timeout=args.header_timeout,
                        body_timeout=args.body_timeout, min_rate=args.min_rate_kb * 1024,
                        max_connections=args.max_connections, max_per_host=args.max_connections_per_host)
    logging.basicConfig(format="%(asctime)s gate %(levelname)s %(message)s", level=logging.WARNING)
    import uvicorn

    config = uvicorn.Config(make_app(args.upstream, args.upstream_ca, limits), host=host, port=int(port),
                            http=protocol_class(limits), lifespan="on", log_level="warning", access_log=False,
                            proxy_headers=False, server_header=False, timeout_keep_alive=limits.keep_alive,
                            limit_concurrency=limits.max_connections + 1,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            ssl_certfile=args.certfile, ssl_keyfile=args.keyfile)
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
