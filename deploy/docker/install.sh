#!/bin/sh
# The install steps of the container image (Dockerfile) and of its test
# (tests/integration/test_container_install.py), so both run the same commands.
#
#   install.sh deps VENV         a virtualenv with the locked runtime dependencies
#   install.sh app VENV SRC      build the dueflow wheel from SRC (in a throwaway
#                                build venv) and install it into VENV
#
# Only wheels are installed (--only-binary), every file checked against the
# lock's hashes. Building the dueflow wheel compiles the modules setup.py lists
# with mypyc where a C compiler is (the Dockerfile's build stage installs gcc);
# without one they stay Python. The runtime needs no compiler.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
pip_install() {
    "$1/bin/python" -m pip install --no-cache-dir --disable-pip-version-check \
        --require-hashes --only-binary=:all: --no-deps -r "$2"
}
case "${1:-}" in
deps)
    venv=$2
    "$python" -m venv "$venv"
    pip_install "$venv" "$here/requirements.lock"
    ;;
app)
    venv=$2
    src=$3
    build=$(mktemp -d)
    "$python" -m venv "$build/venv"
    pip_install "$build/venv" "$here/build-requirements.lock"
    "$build/venv/bin/python" -m pip wheel --no-cache-dir --disable-pip-version-check \
        --no-deps --no-build-isolation --wheel-dir "$build/wheels" "$src"
    "$venv/bin/python" -m pip install --no-cache-dir --disable-pip-version-check \
        --no-deps --no-index "$build"/wheels/dueflow-*.whl
    "$venv/bin/python" -m pip check
    rm -rf "$build"
    ;;
*)
    echo "usage: install.sh deps VENV | install.sh app VENV SRC" >&2
    exit 2
    ;;
esac
