"""What the Fleet-only gate (:mod:`fedhv.flower.gate`) lets through: the exact Fleet API of flwr 1.42.

A SuperNode speaking HTTP (flwr 1.42's ``FleetHttpClient``, ``flwr/supernode/fleet_http_client.py``)
sends ``POST`` requests to twelve fixed paths under ``/v1/fleet/`` (the SuperLink's router,
``flwr/superlink/routers/fleet/router.py``), each with a protobuf body, no query string, and a few
headers (content type, Flower's version metadata, SuperNode authentication's signature). The gate
forwards exactly those and nothing else. Every rule here works on what the client sent (the raw
request target, the method, the headers), never on a decoded or normalised form of it: a Fleet
path is plain ASCII (letters, digits, ``-`` and ``/``), so a target holding a percent sign, a
backslash, a dot or empty segment, a control or non-ASCII byte, a query, or a scheme and host
is refused outright instead of being interpreted. The path that is forwarded is the gate's own
copy of the endpoint (a key of :data:`FLEET_ENDPOINTS`), never the client's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The Fleet API endpoints a SuperNode uses, with their methods (flwr 1.42; all unary POST).
FLEET_ENDPOINTS: dict[str, frozenset[str]] = {
    f"/v1/fleet/{name}": frozenset({"POST"})
    for name in ("register-node", "activate-node", "deactivate-node", "unregister-node", "send-node-heartbeat",
                 "pull-messages", "push-messages", "get-run", "get-fab", "push-object", "pull-object",
                 "confirm-message-received")
}

#: Request headers forwarded to the SuperLink (everything else a client sends is dropped): the body's
#: type, what the client accepts, Flower's version metadata and SuperNode authentication's headers.
FORWARDED_HEADERS: frozenset[str] = frozenset({
    "content-type", "accept", "user-agent", "flwr-package-name", "flwr-package-version", "flwr-component-name",
    "flwr-public-key", "flwr-signature", "flwr-timestamp"})

#: Response headers of the SuperLink not passed back (hop-by-hop, or set by the gate's own server).
DROPPED_RESPONSE_HEADERS: frozenset[str] = frozenset({
    "connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer", "proxy-authenticate",
    "proxy-authorization", "server", "date"})

MIB = 1024 * 1024


@dataclass(frozen=True)
class Refusal:
    """Why a request is not forwarded: the HTTP status and a one-line reason (sent as plain text)."""

    status: int
    reason: str


def _first_bad_byte(data: bytes) -> int | None:
    """The first byte of ``data`` outside printable ASCII (``0x21``-``0x7e``), or ``None``."""
    for byte in data:
        if byte < 0x21 or byte > 0x7E:
            return byte
    return None


def check_target(method: str, raw_path: bytes, query_string: bytes = b"", path: str | None = None) -> str | Refusal:
    """The Fleet endpoint a request may be forwarded to, or why it is refused.

    Parameters
    ----------
    method : str
        The request's method, as sent.
    raw_path : bytes
        The request target as sent, up to its ``?`` (the ASGI scope's ``raw_path``: uvicorn's h11
        server puts the whole target there, scheme and host included for an absolute-form target).
    query_string : bytes
        What followed the ``?`` (ASGI ``query_string``).
    path : str or None
        The server's percent-decoded path (ASGI ``path``); when given it must equal the raw path,
        so a server that decodes or normalises differently cannot disagree with the check.

    Returns
    -------
    str or Refusal
        The endpoint (the key of :data:`FLEET_ENDPOINTS`, byte for byte what is forwarded), or a
        :class:`Refusal`: 400 for a malformed or non-canonical target, 403 for a well-formed path
        that is not a Fleet endpoint, 405 for another method than the endpoint's.
    """
    if not raw_path.startswith(b"/"):
        return Refusal(400, "only an origin-form target (/v1/fleet/...) is accepted, not an absolute-form or "
                            "asterisk-form one")
    for part, name in ((raw_path, "path"), (query_string, "query")):
        bad = _first_bad_byte(part)
        if bad is not None:
            return Refusal(400, f"byte 0x{bad:02x} (a control, space or non-ASCII byte) in the {name}")
    if b"\\" in raw_path:
        return Refusal(400, "backslash in the path")
    if b"%" in raw_path:
        return Refusal(400, "percent-encoded byte in the path (Fleet API paths hold none; encoded dots, separators "
                            "and double encodings are refused)")
    if query_string:
        return Refusal(400, "query string (the Fleet API takes none)")
    segments = raw_path.split(b"/")[1:]
    if any(seg == b"" for seg in segments):
        return Refusal(400, "empty path segment (// or a trailing /)")
    if any(seg in (b".", b"..") for seg in segments):
        return Refusal(400, "dot segment (. or ..) in the path")
    text = raw_path.decode("ascii")
    if path is not None and path != text:
        return Refusal(400, "the server's decoded path differs from the raw target")
    endpoint = next((known for known in FLEET_ENDPOINTS if known == text), None)
    if endpoint is None:
        return Refusal(403, "not served here: this address forwards the Fleet API only (the operator uses the "
                            "SuperLink's own address)")
    if method not in FLEET_ENDPOINTS[endpoint]:
        return Refusal(405, f"method {method[:16]!r} not allowed on {endpoint} (allowed: "
                            f"{', '.join(sorted(FLEET_ENDPOINTS[endpoint]))})")
    return endpoint


def check_headers(headers: list[tuple[bytes, bytes]], max_body: int) -> tuple[int, list[tuple[str, str]]] | Refusal:
    """The body's length and the headers to forward, or why the request is refused.

    Parameters
    ----------
    headers : list of (bytes, bytes)
        The request's headers (ASGI ``headers``: names lower-case).
    max_body : int
        The largest body accepted, in bytes.

    Returns
    -------
    (int, list of (str, str)) or Refusal
        The declared body length and the allow-listed headers (:data:`FORWARDED_HEADERS`, each at
        most once); or a :class:`Refusal`: 411 without ``Content-Length`` or with a
        ``Transfer-Encoding`` (every SuperNode request declares its length), 400 for a malformed
        or repeated one, 413 for a body over ``max_body``.
    """
    lengths = [value for name, value in headers if name == b"content-length"]
    if any(name == b"transfer-encoding" for name, _ in headers):
        return Refusal(411, "Transfer-Encoding is not accepted; send the body with a Content-Length")
    if not lengths:
        return Refusal(411, "a Content-Length is required")
    if len(lengths) > 1 or not lengths[0].isdigit() or len(lengths[0]) > 15:
        return Refusal(400, "malformed or repeated Content-Length")
    length = int(lengths[0])
    if length > max_body:
        return Refusal(413, f"body of {length} bytes exceeds the gate's limit of {max_body} bytes "
                            f"({max_body / MIB:g} MiB, --max-body-mb)")
    forwarded: list[tuple[str, str]] = []
    seen: set[str] = set()
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name not in FORWARDED_HEADERS:
            continue
        if name in seen:
            return Refusal(400, f"header {name} repeated")
        seen.add(name)
        forwarded.append((name, raw_value.decode("latin-1")))
    return length, forwarded
