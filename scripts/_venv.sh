# Shared by scripts/run and scripts/test: make .venv (once) and install pymq into it with the
# extras named in $1.  The install is skipped when pyproject.toml, the C extension's source and the
# extras are unchanged since the last successful install, so a second run starts at once.
# shellcheck shell=bash

pymq_find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "pymq needs Python 3.11 or newer on PATH (set PYTHON=/path/to/python3.11)" >&2
    return 1
}

pymq_ensure_venv() {
    local extras="$1" python stamp want
    if [ ! -x .venv/bin/python ]; then
        python=$(pymq_find_python)
        echo "creating .venv with $python" >&2
        "$python" -m venv .venv
    fi
    stamp=.venv/.pymq-installed
    # The C extension is built at install time, so its source is part of what is installed.
    want="$(cat pyproject.toml setup.py pymq/common/_native.h $(find pymq -name '_*c.c' | sort) | sha256sum | cut -d' ' -f1) [$extras]"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        echo "installing pymq${extras:+[$extras]} into .venv" >&2
        .venv/bin/python -m pip install --quiet --upgrade pip
        .venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
        echo "$want" >"$stamp"
    fi
}
