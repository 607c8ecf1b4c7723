#!/usr/bin/env bash
# The generate example in a real terminal (tmux): on a narrow terminal the --live canvas leaves
# no stale rows, and Ctrl-C prints the partial answer with its stats and exits 130.
#
#   tools/cli/terminal_test.sh          # GENERATE_BIN: the example (default target/debug/examples/generate)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v tmux >/dev/null || { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }
BIN=${GENERATE_BIN:-target/debug/examples/generate}
[ -x "$BIN" ] || cargo build --quiet --example generate
SESSION=dg-terminal-test-$$
OUT=$(mktemp -d)
trap 'tmux kill-session -t "$SESSION" 2>/dev/null || true; rm -rf "$OUT"' EXIT
fail() { echo "FAIL: $*"; echo "--- screen ---"; cat "$OUT/screen"; exit 1; }

# 1. --live on a 40-column terminal: a long generation, many steps, captured at the end.
tmux new-session -d -s "$SESSION" -x 40 -y 30 \
    "$BIN --live -n 48 --steps 24 --sampler entropy-bound 'Write about the sea'; echo EXIT=\$?; sleep 30"
for _ in $(seq 1 600); do
    tmux capture-pane -p -t "$SESSION" > "$OUT/screen"
    grep -q '^EXIT=' "$OUT/screen" && break
    sleep 0.1
done
grep -q '^EXIT=0' "$OUT/screen" || fail "the live run did not exit 0"
# A draft row starts with "[block"; once the answer is done none may be left on screen.
if grep -q '\[block' "$OUT/screen"; then fail "a stale --live row is left on the screen"; fi
grep -q '^\[Length\]\|^\[Stop\]' "$OUT/screen" || fail "no stats line"
tmux kill-session -t "$SESSION"

# 2. Ctrl-C during a long generation: partial answer, stats, exit 130.
tmux new-session -d -s "$SESSION" -x 80 -y 30 \
    "$BIN -n 4000 --steps 200 --sampler entropy-bound 'Write about the sea'; echo EXIT=\$?; sleep 30"
for _ in $(seq 1 300); do
    tmux capture-pane -p -t "$SESSION" > "$OUT/screen"
    grep -q 'RANDOM-weight' "$OUT/screen" && break
    sleep 0.1
done
sleep 2
tmux send-keys -t "$SESSION" C-c
for _ in $(seq 1 300); do
    tmux capture-pane -p -t "$SESSION" > "$OUT/screen"
    grep -q '^EXIT=' "$OUT/screen" && break
    sleep 0.1
done
grep -q '^EXIT=130' "$OUT/screen" || fail "Ctrl-C did not exit 130"
grep -q '^\[Cancelled\]' "$OUT/screen" || fail "no stats after Ctrl-C"
echo "terminal test: 2 passed, 0 failed"
