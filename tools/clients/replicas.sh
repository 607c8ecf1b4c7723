#!/usr/bin/env bash
# Scale-out on loopback: two serve replicas behind nginx (deploy/nginx.conf), driven through
# the balancer by the official SDKs (test_clients.py).
#
#   tools/clients/replicas.sh
#
# Installs nginx with apt-get when it is missing. Checks that both replicas answered requests,
# that SIGTERM stops each with exit code 0, and that while one replica is gone the balancer
# still answers from the other.
#
# SERVE_BIN: the serve binary (see common.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=tools/clients/common.sh
source tools/clients/common.sh
WORK=$(mktemp -d)
PIDS=()
NGINX_PID=

cleanup() {
    for pid in "${PIDS[@]}" $NGINX_PID; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}" $NGINX_PID; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

if ! command -v nginx >/dev/null 2>&1; then
    echo "installing nginx"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

prepare

ADDRS=()
for i in 1 2; do
    "$BIN" --model "$MODEL" --host 127.0.0.1 --port 0 --max-body-bytes "$MAX_BODY" \
        --model-name tiny-vision >"$WORK/replica$i.log" 2>&1 &
    PIDS+=($!)
done
for i in 0 1; do
    addr=$(ready "$WORK/replica$((i + 1)).log" "${PIDS[$i]}")
    ADDRS+=("$addr")
done
echo "replicas at ${ADDRS[*]}"

# nginx on a free port, the upstreams pointed at the replicas.
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$WORK/nginx/tmp"
# Run as root, nginx's workers drop to an unprivileged user: they write large request bodies
# under tmp/.
chmod 755 "$WORK" "$WORK/nginx"
chmod 1777 "$WORK/nginx/tmp"
sed -e "s/127.0.0.1:8081/${ADDRS[0]}/" -e "s/127.0.0.1:8082/${ADDRS[1]}/" \
    -e "s/listen 127.0.0.1:8080;/listen 127.0.0.1:$PORT;/" \
    deploy/nginx.conf >"$WORK/nginx/nginx.conf"
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' >"$WORK/nginx.log" 2>&1 &
NGINX_PID=$!
BALANCER=127.0.0.1:$PORT
for _ in $(seq 1 100); do
    curl -sf "http://$BALANCER/health" >/dev/null 2>&1 && break
    kill -0 "$NGINX_PID" 2>/dev/null || { cat "$WORK/nginx.log"; exit 1; }
    sleep 0.1
done
echo "nginx at http://$BALANCER"

"$VENV/bin/python" tools/clients/test_clients.py --base-url "http://$BALANCER" --max-body-bytes "$MAX_BODY"

# Both replicas served.
for addr in "${ADDRS[@]}"; do
    served=$(curl -sf "http://$addr/metrics" \
        | awk '/^dg_requests_total/ && /outcome="ok"/ { n += $2 } END { print n + 0 }')
    echo "replica $addr answered $served requests"
    [ "$served" -gt 0 ] || { echo "replica $addr answered nothing" >&2; exit 1; }
done

# One replica stops (SIGTERM, exit 0): the balancer answers from the other.
terminate "${PIDS[0]}"
[ "$STATUS" -eq 0 ] || { echo "replica 1 exited with $STATUS after SIGTERM" >&2; exit 1; }
PIDS=("${PIDS[1]}")
for i in 1 2 3 4; do
    curl -sf "http://$BALANCER/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages": [{"role": "user", "content": "Still there?"}], "max_tokens": 8}' \
        | grep -q '"chat.completion"'
done
echo "with one replica gone, the balancer still answers"

terminate "${PIDS[0]}"
PIDS=()
[ "$STATUS" -eq 0 ] || { echo "replica 2 exited with $STATUS after SIGTERM" >&2; exit 1; }
echo "replicas stopped on SIGTERM with exit code 0"
