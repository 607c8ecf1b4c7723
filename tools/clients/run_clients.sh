#!/usr/bin/env bash
# The server driven by the official Python SDKs and by the README's curl examples.
#
#   tools/clients/run_clients.sh
#
# Creates .venv-clients (pinned openai + anthropic), starts the serve example on a free loopback
# port with the tiny-vision fixture, waits for /health, runs test_clients.py and the README's
# curl block, then stops the server with SIGTERM and checks that it exits 0.
#
# SERVE_BIN: the serve binary (see common.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=tools/clients/common.sh
source tools/clients/common.sh
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

prepare

# Port 0: the server picks a free port and logs it; no race for a port.
"$BIN" --model "$MODEL" --host 127.0.0.1 --port 0 --max-body-bytes "$MAX_BODY" \
    >"$WORK/server.log" 2>&1 &
SERVER_PID=$!

ADDR=$(ready "$WORK/server.log" "$SERVER_PID")
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

terminate "$SERVER_PID"
SERVER_PID=
if [ "$STATUS" -ne 0 ]; then
    cat "$WORK/server.log"
    echo "the server exited with $STATUS after SIGTERM (expected 0)" >&2
    exit 1
fi
echo "server stopped on SIGTERM with exit code 0"
