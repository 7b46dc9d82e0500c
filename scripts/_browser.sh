# Sourced by scripts/test: makes sure Debian's Chromium is there for the browser tests (Playwright
# drives it; Playwright's own browser download is not used). Installs it with apt-get when missing.
# DAGSTER_STATEFUL_SKIP_BROWSER=1 installs nothing and leaves the browser tests out.
BROWSER_TESTS="tests/dagster/test_ui*.py"

skip_browser() {
    [ "${DAGSTER_STATEFUL_SKIP_BROWSER:-}" = 1 ]
}

# pytest arguments that leave the browser tests out when they are skipped (none otherwise).
browser_pytest_args() {
    BROWSER_PYTEST_ARGS=()
    if skip_browser; then
        BROWSER_PYTEST_ARGS=(--ignore-glob="$ROOT/$BROWSER_TESTS")
    fi
}

ensure_chromium() {
    if skip_browser; then
        echo "==> DAGSTER_STATEFUL_SKIP_BROWSER=1: no Chromium, the browser tests ($BROWSER_TESTS) are left out" >&2
        return 0
    fi
    if [ -x "${DAGSTER_STATEFUL_CHROMIUM:-/usr/bin/chromium}" ]; then
        return 0
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "error: the browser tests need Chromium; install it with 'apt-get install chromium' (as root)," \
                 "set DAGSTER_STATEFUL_CHROMIUM to a Chromium binary, or DAGSTER_STATEFUL_SKIP_BROWSER=1 to skip them" >&2
            return 1
        fi
    fi
    echo "==> installing Debian's chromium for the browser tests (once)" >&2
    $sudo apt-get install -y -q --no-install-recommends chromium >&2 ||
        { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q --no-install-recommends chromium >&2; }
}
