# Sourced by the scripts that run Python: picks the interpreter and checks for the modules they need.
#
# The interpreter, first found of:
#   1. $PYTHON, when set (a node's own environment, or the interpreter running a test);
#   2. the venv the README's commands create: $SPLITKV_VENV, else .venv at the repository root;
#   3. python3 on PATH.
# Usage: source scripts/lib/python.sh; then "$PYTHON" ...; need_module torch "install torch: ..."

_splitkv_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    _splitkv_venv="${SPLITKV_VENV:-$_splitkv_root/.venv}"
    if [[ -x "$_splitkv_venv/bin/python" ]]; then
        PYTHON="$_splitkv_venv/bin/python"
    else
        PYTHON=python3
    fi
fi
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "error: no Python interpreter: $PYTHON not found (set PYTHON, or run scripts/setup_env.sh)" >&2
    exit 2
fi

# need_module MODULE HINT: exit 2 with one line on stderr when "$PYTHON" cannot import MODULE.
need_module() {
    if ! "$PYTHON" -c "import $1" >/dev/null 2>&1; then
        echo "error: $PYTHON cannot import $1: $2" >&2
        exit 2
    fi
}
