#!/usr/bin/env bash
# Runs each fuzz target of tests/fuzz.rs for a fixed budget and prints one summary line per
# target (inputs run, errors returned, panics, hangs).
#
#   tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
#   tools/fuzz.sh 600                     # ten minutes per target, all five targets
#   tools/fuzz.sh 60 image tokenizer      # one minute each, two targets
#   DG_FUZZ_SEED=0x1234 tools/fuzz.sh 60  # another seed (the default is fixed)
#   DG_FUZZ_JOBS=2 tools/fuzz.sh 600      # two targets at a time
#
# The build is `cargo test --release --test fuzz` with overflow checks and debug assertions on,
# in target/fuzz (DG_FUZZ_TARGET_DIR).
# Targets: config_json safetensors_header chat_template tokenizer image. Each runs as its own
# test process (release build), so a target that aborts the process does not hide the others;
# full logs are left in $DG_FUZZ_LOG_DIR (default target/fuzz-logs). The exit status is 0 only
# if every target ran without a panic, abort or hang.
set -uo pipefail

cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(config_json safetensors_header chat_template tokenizer image)
fi
jobs=${DG_FUZZ_JOBS:-1}
logs=${DG_FUZZ_LOG_DIR:-target/fuzz-logs}
mkdir -p "$logs"

# Release speed with overflow checks and debug assertions kept (an overflow is a finding, not a
# silently wrapped size), in a target directory of its own so that other release builds are
# not rebuilt.
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export CARGO_TARGET_DIR=${DG_FUZZ_TARGET_DIR:-target/fuzz}
# Built once; each target then runs the test binary itself (what `cargo test --release --test
# fuzz TARGET -- --exact --test-threads=1 --nocapture` runs, without rebuilding mid-run).
bin=$(cargo test --release --test fuzz --no-run 2>&1 | tee "$logs/build.log" |
    sed -n 's/.*Executable tests\/fuzz.rs (\(.*\))$/\1/p' | tail -1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    tail -20 "$logs/build.log"
    echo "fuzz: the build failed (log: $logs/build.log)" >&2
    exit 1
fi

run_one() {
    local t=$1
    DG_FUZZ_SECONDS=$seconds "$bin" "$t" --exact --test-threads=1 --nocapture >"$logs/$t.log" 2>&1
    echo $? >"$logs/$t.rc"
}

running=0
for t in "${targets[@]}"; do
    run_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

status=0
echo "fuzz summary (${seconds} s per target, seed ${DG_FUZZ_SEED:-default}):"
for t in "${targets[@]}"; do
    line=$(grep -ao "fuzz $t: [0-9]* inputs.*" "$logs/$t.log" | tail -1)
    rc=$(cat "$logs/$t.rc" 2>/dev/null || echo '?')
    if [ -z "$line" ]; then
        line="fuzz $t: no summary (the process died: exit $rc; an abort or a crash, see $logs/$t.log)"
    fi
    echo "  $line"
    if [ "$rc" != 0 ]; then
        status=1
        grep -a "PANIC at\|HANG at" "$logs/$t.log" | head -5 | sed 's/^/      /'
    fi
done
exit $status
