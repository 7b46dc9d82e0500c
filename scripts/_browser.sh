# Sourced by scripts/test: makes sure Debian's Chromium is there for the browser test (Playwright
# drives it; Playwright's own browser download is not used). Installs it with apt-get when missing.
ensure_chromium() {
    if [ -x "${DAGSTER_STATEFUL_CHROMIUM:-/usr/bin/chromium}" ]; then
        return 0
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "error: the browser test needs Chromium; install it with 'apt-get install chromium' (as root)" \
                 "or set DAGSTER_STATEFUL_CHROMIUM to a Chromium binary" >&2
            return 1
        fi
    fi
    echo "==> installing Debian's chromium for the browser test (once)" >&2
    $sudo apt-get install -y -q --no-install-recommends chromium >&2 ||
        { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q --no-install-recommends chromium >&2; }
}
