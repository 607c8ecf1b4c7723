# What run_clients.sh and replicas.sh share; sourced from the repository root under
# `set -euo pipefail`.
#
# SERVE_BIN: the serve binary (default: target/debug/examples/serve, built by `cargo test`;
# built with `cargo build --example serve` when missing).

VENV=.venv-clients
MODEL=tests/fixtures/models/tiny-vision
MAX_BODY=1000000
BIN=${SERVE_BIN:-target/debug/examples/serve}

# The clients' venv (pinned openai + anthropic) and the serve binary.
prepare() {
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r tools/clients/requirements.txt

    if [ ! -x "$BIN" ]; then
        cargo build --example serve
        BIN=target/debug/examples/serve
    fi
}

# ready LOG PID: waits (60 s at most) for `listening on` in the server's LOG and for its
# /health; prints the address. Port 0: the server picks a free port and logs it.
ready() {
    local log=$1 pid=$2 addr=
    for _ in $(seq 1 600); do
        addr=$(sed -n 's/.*listening on http:\/\/\([0-9.:]*\).*/\1/p' "$log" | head -n1)
        if [ -n "$addr" ] && curl -sf "http://$addr/health" >/dev/null 2>&1; then
            echo "$addr"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$log" >&2
    echo "the server $pid exited or was not ready in 60 s" >&2
    return 1
}

# terminate PID: SIGTERM, then waits for it; its exit status in STATUS.
terminate() {
    kill -TERM "$1"
    set +e
    wait "$1"
    STATUS=$?
    set -e
}
