#!/usr/bin/env bash
# Create the reference venv (mlx-optiq 0.7.7 on mlx 0.32.4 + mlx-cpu 0.32.4, pinned in
# requirements.txt) that tools/reference/*.py run in.
#
#   tools/reference/setup.sh                      # venv at <repo>/.venv-ref
#   DG_REF_VENV=/path/to/venv tools/reference/setup.sh
#
# Needs Python 3.11 (set PYTHON=... to choose the interpreter) and access to PyPI.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${DG_REF_VENV:-$root/.venv-ref}
python=${PYTHON:-python3.11}

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --no-deps -r "$here/requirements.txt"
"$venv/bin/python" -m pip check
"$venv/bin/python" - <<'PY'
import mlx.core as mx
import mlx_lm
from importlib.metadata import version

assert mx.__version__ == "0.32.4", mx.__version__
assert version("mlx-cpu") == "0.32.4", version("mlx-cpu")
assert version("mlx-optiq") == "0.7.7", version("mlx-optiq")
print(f"reference venv ready: mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}, "
      f"mlx-optiq {version('mlx-optiq')}")
PY
echo "run: DG_REF_VENV=$venv tools/reference/regenerate.sh"
