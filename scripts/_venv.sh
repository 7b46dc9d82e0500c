# Sourced by the scripts in this directory: creates (once) and refreshes the project's virtual
# environment. `ensure_venv EXTRAS` installs the package with those extras when pyproject.toml
# changed since the last install. Honors DAGSTER_STATEFUL_VENV and PYTHON.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DAGSTER_STATEFUL_VENV:-$ROOT/.venv}"
UV_PIN="uv==0.13.9"

find_python() {
    for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
           "$candidate" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "error: Python 3.11, 3.12 or 3.13 is required (tried \$PYTHON, python3.11, python3.12, python3.13," \
         "python3); set PYTHON to such an interpreter" >&2
    return 1
}

ensure_venv() {
    local extras="${1:-}"
    if [ ! -x "$VENV/bin/python" ]; then
        local python
        python="$(find_python)"
        echo "==> creating a virtual environment in $VENV" >&2
        "$python" -m venv "$VENV"
        # uv installs the same pins as pip in half the time; pip stays the fallback.
        "$VENV/bin/python" -m pip install --quiet "$UV_PIN" >&2 ||
            "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    fi
    local hash stamp
    hash="$(sha256sum <"$ROOT/pyproject.toml" | cut -c1-16)"
    stamp="$VENV/.installed-$hash-${extras:-base}"
    # An install with extras also satisfies the plain one.
    if [ ! -f "$stamp" ] && { [ -n "$extras" ] || ! compgen -G "$VENV/.installed-$hash-*" >/dev/null; }; then
        echo "==> installing dagster-stateful${extras:+[$extras]} and its dependencies (first time: a few minutes)" >&2
        if "$VENV/bin/python" -m uv --version >/dev/null 2>&1; then
            "$VENV/bin/python" -m uv pip install --quiet --python "$VENV/bin/python" \
                --editable "$ROOT${extras:+[$extras]}" >&2
        else
            "$VENV/bin/python" -m pip install --quiet --editable "$ROOT${extras:+[$extras]}" >&2
        fi
        find "$VENV" -maxdepth 1 -name '.installed-*' ! -name ".installed-$hash-*" -delete
        touch "$stamp"
    fi
    export PATH="$VENV/bin:$PATH"
}
