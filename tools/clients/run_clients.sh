#!/usr/bin/env bash
# The server driven by the official Python SDKs and by the README's curl examples.
#
#   tools/clients/run_clients.sh
#
# Creates .venv-clients (pinned openai + anthropic), starts the serve example on a free loopback
# port with the tiny-vision fixture, waits for /health, runs test_clients.py and the README's
# curl block, then stops the server with SIGTERM and checks that it exits 0.
#
# SERVE_BIN: the serve binary (default: target/debug/examples/serve, built by `cargo test`;
# built with `cargo build --example serve` when missing).
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=.venv-clients
MODEL=tests/fixtures/models/tiny-vision
MAX_BODY=1000000
BIN=${SERVE_BIN:-target/debug/examples/serve}
WORK=$(mktemp -d)
SERVER_PID=

cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r tools/clients/requirements.txt

if [ ! -x "$BIN" ]; then
    cargo build --example serve
    BIN=target/debug/examples/serve
fi

# Port 0: the server picks a free port and logs it; no race for a port.
"$BIN" --model "$MODEL" --host 127.0.0.1 --port 0 --max-body-bytes "$MAX_BODY" \
    >"$WORK/server.log" 2>&1 &
SERVER_PID=$!

ADDR=
for _ in $(seq 1 600); do
    ADDR=$(sed -n 's/.*listening on http:\/\/\([0-9.:]*\).*/\1/p' "$WORK/server.log" | head -n1)
    if [ -n "$ADDR" ] && curl -sf "http://$ADDR/health" >/dev/null 2>&1; then
        break
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        cat "$WORK/server.log"
        echo "the server exited before it was ready" >&2
        exit 1
    fi
    sleep 0.1
done
if ! curl -sf "http://$ADDR/health" >/dev/null; then
    cat "$WORK/server.log"
    echo "the server was not ready in 60 s" >&2
    exit 1
fi
echo "server ready at http://$ADDR"

"$VENV/bin/python" tools/clients/test_clients.py --base-url "http://$ADDR" --max-body-bytes "$MAX_BODY"

# The README's curl examples: the block after its "run_clients.sh runs the next block" marker,
# pointed at this server; every request must succeed (HTTP 2xx).
awk '/run_clients.sh runs the next block/ { marked = 1; next }
     marked && /^```/ { if (inside) exit; inside = 1; next }
     inside { print }' README.md | sed "s#localhost:8080#$ADDR#g" >"$WORK/readme_curl.sh"
if ! grep -q curl "$WORK/readme_curl.sh"; then
    echo "no curl examples found in README.md" >&2
    exit 1
fi
(
    curl() { command curl --fail-with-body --no-progress-meter --max-time 120 "$@"; echo; }
    set -e
    # shellcheck disable=SC1091
    source "$WORK/readme_curl.sh"
) >"$WORK/readme_curl.out"
echo "README curl examples: ok ($(grep -c '^curl' "$WORK/readme_curl.sh") commands)"
grep -q '"chat.completion"' "$WORK/readme_curl.out"
grep -q 'data: \[DONE\]' "$WORK/readme_curl.out"
grep -q 'event: message_stop' "$WORK/readme_curl.out"

kill -TERM "$SERVER_PID"
set +e
wait "$SERVER_PID"
STATUS=$?
set -e
SERVER_PID=
if [ "$STATUS" -ne 0 ]; then
    cat "$WORK/server.log"
    echo "the server exited with $STATUS after SIGTERM (expected 0)" >&2
    exit 1
fi
echo "server stopped on SIGTERM with exit code 0"
