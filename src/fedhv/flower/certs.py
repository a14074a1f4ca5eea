"""Test TLS certificates and SuperNode authentication keys for a Flower deployment.

``python -m fedhv.flower.certs DIR [--nodes N] [--host NAME ...]`` (or
``scripts/flower_certs.sh``) writes, with the ``cryptography`` package that flwr
depends on:

- ``DIR/ca.crt``, ``DIR/ca.key``: a self-signed test CA (P-384, valid 30 days);
- ``DIR/server.pem``, ``DIR/server.key``: the SuperLink's certificate, signed by the CA,
  for ``localhost``, ``127.0.0.1`` and every ``--host`` (the names SuperNodes dial);
- ``DIR/node-K``, ``DIR/node-K.pub`` for ``K < N``: SuperNode authentication keys as
  Flower 1.42 expects them (ECDSA P-384, OpenSSH format: what ``ssh-keygen -t ecdsa
  -b 384`` writes).

The SuperLink runs with ``--ssl-ca-certfile ca.crt --ssl-certfile server.pem
--ssl-keyfile server.key --enable-supernode-auth``; each SuperNode with
``--root-certificates ca.crt --auth-supernode-private-key node-K``, after its public key
was registered (``flwr supernode register node-K.pub <connection>``). These are test
certificates: a production deployment uses its own CA and keeps ``ca.key`` offline.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import sys
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedhv import safe_io

VALID_DAYS = 30


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    # An exclusive temporary file renamed over ``path``: never through a planted link, and a private key is
    # 0o600 from its first byte on.
    safe_io.write_atomic_bytes(path, data, mode=0o600 if private else None)


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys(["localhost", "127.0.0.1", *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def make_tls(out: str | Path, hosts: Sequence[str] = ()) -> dict[str, Path]:
    """A test CA and a SuperLink server certificate for ``localhost``, ``127.0.0.1`` and ``hosts``.

    Returns the paths ``{"ca": ca.crt, "cert": server.pem, "key": server.key}``.
    """
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedhv test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA384()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedhv superlink")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(until).add_extension(_san(hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA384()))
    paths = {"ca": d / "ca.crt", "cert": d / "server.pem", "key": d / "server.key"}
    _write(paths["ca"], ca.public_bytes(serialization.Encoding.PEM))
    _write(d / "ca.key", _pem_key(ca_key), private=True)
    _write(paths["cert"], cert.public_bytes(serialization.Encoding.PEM))
    _write(paths["key"], _pem_key(key), private=True)
    return paths


def make_node_key(out: str | Path, name: str) -> tuple[Path, Path]:
    """A SuperNode authentication key pair ``(out/name, out/name.pub)``: ECDSA P-384 in OpenSSH format."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    priv, pub = d / name, d / f"{name}.pub"
    _write(priv, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                   serialization.NoEncryption()), private=True)
    _write(pub, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                              serialization.PublicFormat.OpenSSH) + b"\n")
    return priv, pub


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="test CA, SuperLink certificate and SuperNode auth keys")
    parser.add_argument("out", help="folder to write into (created)")
    parser.add_argument("--nodes", type=int, default=0, help="SuperNode key pairs node-0 .. node-(N-1)")
    parser.add_argument("--host", action="append", default=[],
                        help="extra name or IP of the SuperLink host for the certificate (repeatable)")
    args = parser.parse_args(argv)
    if args.nodes < 0:
        print(f"error: --nodes {args.nodes} is negative; give 0 or more", file=sys.stderr)
        return 2
    paths = make_tls(args.out, args.host)
    for k in range(args.nodes):
        make_node_key(args.out, f"node-{k}")
    print(f"CA {paths['ca']}, SuperLink certificate {paths['cert']} (key {paths['key']}), "
          f"{args.nodes} SuperNode key pairs in {Path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
