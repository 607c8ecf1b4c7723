#!/usr/bin/env bash
# Builds and runs tools/downstream, an app outside the workspace that depends on dg-engine by
# path and uses only its public API. Dependency versions are pinned to the workspace's lock file
# and the workspace's target directory is shared, so little is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/../.."
cp Cargo.lock tools/downstream/Cargo.lock
CARGO_TARGET_DIR="$PWD/target" cargo run --quiet --manifest-path tools/downstream/Cargo.toml
