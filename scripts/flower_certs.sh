#!/usr/bin/env bash
# Test CA, SuperLink certificate and SuperNode authentication keys for a Flower deployment.
#
#   scripts/flower_certs.sh OUT_DIR [NODES] [SUPERLINK_HOST ...]
#
# OUT_DIR/ca.crt (+ ca.key), OUT_DIR/server.pem + server.key (for localhost, 127.0.0.1 and
# every SUPERLINK_HOST), OUT_DIR/node-K + node-K.pub for K < NODES (ECDSA P-384, OpenSSH
# format, as `flwr supernode register` and `--auth-supernode-private-key` expect).
# Uses openssl and ssh-keygen when both are installed, else fedhv's Python version
# (python -m fedhv.flower.certs, the `cryptography` package that flwr depends on).
# Test certificates: a real deployment uses its own CA and keeps ca.key offline.
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [NODES] [SUPERLINK_HOST ...]}
nodes=${2:-0}
shift $(( $# >= 2 ? 2 : 1 ))
if ! command -v openssl >/dev/null || ! command -v ssh-keygen >/dev/null; then
    args=("$out" --nodes "$nodes")
    for h in "$@"; do args+=(--host "$h"); done
    exec "${PYTHON:-python3}" -m fedhv.flower.certs "${args[@]}"
fi
mkdir -p "$out"
san="DNS:localhost,IP:127.0.0.1"
for h in "$@"; do
    if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+=",IP:$h"; else san+=",DNS:$h"; fi
done
openssl ecparam -name secp384r1 -genkey -noout -out "$out/ca.key"
openssl req -x509 -new -key "$out/ca.key" -sha384 -days 30 -subj "/CN=fedhv test CA" -out "$out/ca.crt"
openssl ecparam -name secp384r1 -genkey -noout -out "$out/server.key"
openssl req -new -key "$out/server.key" -subj "/CN=fedhv superlink" -out "$out/server.csr"
printf 'subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\n' "$san" > "$out/server.ext"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial -days 30 \
    -sha384 -extfile "$out/server.ext" -out "$out/server.pem" 2>/dev/null
rm -f "$out/server.csr" "$out/server.ext" "$out/ca.srl"
chmod 600 "$out/ca.key" "$out/server.key"
for ((k = 0; k < nodes; k++)); do
    rm -f "$out/node-$k" "$out/node-$k.pub"
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedhv node-$k" -f "$out/node-$k"
done
echo "CA $out/ca.crt, SuperLink certificate $out/server.pem (key $out/server.key), $nodes SuperNode key pairs in $out"
