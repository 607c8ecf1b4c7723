#!/usr/bin/env bash
# Writes a random-weight checkpoint of the real DiffusionGemma 26B-A4B geometry once into a cache
# folder (never into the repository) and reports the writer's peak RSS (/usr/bin/time -v).
#
#   tools/bench/write_real_geometry.sh [LAYERS]      # default 30 layers
#   DG_REAL_GEOMETRY_DIR=/some/dir tools/bench/write_real_geometry.sh 2
#
# Disk: about 0.39 GB per layer plus 0.42 GB of embeddings, twice that while writing (the
# tensors are spilled to a scratch file, then laid out into shards). The script refuses to start
# when the disk lacks that room, and does nothing when the folder already holds a checkpoint.
set -euo pipefail
layers="${1:-30}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${DG_REAL_GEOMETRY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dg/real-geometry-${layers}l}"
if [ -f "$out/config.json" ]; then
    echo "already written: $out"
    exit 0
fi
need_gb=$(( (layers * 39 + 42) * 2 / 100 + 1 ))
mkdir -p "$out"
free_gb=$(df -Pk "$out" | awk 'NR == 2 { print int($4 / 1048576) }')
if [ "$free_gb" -lt "$need_gb" ]; then
    echo "need about $need_gb GB free at $out, have $free_gb GB" >&2
    exit 1
fi
shards=$(( layers / 2 + 1 ))
cd "$root"
cargo build --release --example write_checkpoint
/usr/bin/time -v target/release/examples/write_checkpoint --real --layers "$layers" \
    --shards "$shards" --out "$out" 2> "$out.time.txt"
grep -E "Maximum resident set size|Elapsed \(wall clock\)" "$out.time.txt"
du -sh "$out"
