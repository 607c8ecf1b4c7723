#!/usr/bin/env bash
# Regenerate every reference fixture and golden, in dependency order, then check the fixtures.
#
#   DG_REF_VENV=/path/to/venv tools/reference/regenerate.sh    # default venv: <repo>/.venv-ref
#   DG_REF_SKIP_CHECKS=1 tools/reference/regenerate.sh          # skip the slow stability check
#
# Checkpoints first (the goldens are computed from them), then the goldens, then
# check_fixture_stability.py (the trajectory-robustness check, a few minutes). Scripts that are
# not there yet are skipped with a note; any other dump_*.py runs after the known ones.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${DG_REF_VENV:-$root/.venv-ref}
py=${DG_REF_PYTHON:-$venv/bin/python}
if [ ! -x "$py" ]; then
    echo "no reference python at $py: run tools/reference/setup.sh, or set DG_REF_VENV" >&2
    exit 1
fi

ordered=(
    make_checkpoints.py          # tests/fixtures/models/tiny, tiny-sharded
    make_vision_checkpoints.py   # tests/fixtures/models/tiny-vision*, tests/fixtures/images
    make_lora_adapters.py        # tests/fixtures/adapters (trained by the reference, patched)
    dump_rng_goldens.py
    dump_sampler_goldens.py
    dump_quant_goldens.py
    dump_model_goldens.py
)

run() {
    echo "== $1"
    (cd "$root" && "$py" "$here/$1")
}

for script in "${ordered[@]}"; do
    if [ -f "$here/$script" ]; then
        run "$script"
    else
        echo "== $script: not present, skipped"
    fi
done
for path in "$here"/dump_*.py; do
    script=$(basename "$path")
    case " ${ordered[*]} " in
        *" $script "*) ;;
        *) run "$script" ;;
    esac
done

if [ "${DG_REF_SKIP_CHECKS:-0}" != "1" ] && [ -f "$here/check_fixture_stability.py" ]; then
    run check_fixture_stability.py
fi
echo "== done; review with: git status --short tests/fixtures"
