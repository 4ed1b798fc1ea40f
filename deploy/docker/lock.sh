#!/bin/sh
# Regenerate the container image's hashed lockfiles (`make lock`):
#   requirements.lock        dueflow's runtime dependencies, from pyproject.toml
#   build-requirements.lock  what builds the dueflow wheel (setuptools, wheel; mypy,
#                            whose mypyc compiles the modules setup.py lists)
# Resolved for CPython 3.11 on Linux; each pin carries the hashes of every file
# of its release on PyPI, so the same lock installs on x86_64 and arm64.
# tests/unit/test_container_image.py checks that requirements.lock pins every
# dependency of pyproject.toml within its range.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
uv=${UV:-uv}
compile() {
    "$uv" pip compile --quiet --generate-hashes --python-version 3.11 \
        --python-platform linux --no-header --annotation-style line "$@"
}
cd "$root"
{
    echo "# dueflow's runtime dependencies, pinned with hashes: regenerate with \`make lock\`"
    echo "# (deploy/docker/lock.sh) after changing [project] dependencies in pyproject.toml."
    compile pyproject.toml
} > "$here/requirements.lock"
printf 'setuptools>=65\nwheel\nmypy>=1.11\n' > "$here/.build-requirements.in"
{
    echo "# What builds the dueflow wheel in the image, pinned with hashes (\`make lock\`)."
    compile "$here/.build-requirements.in"
} > "$here/build-requirements.lock"
rm -f "$here/.build-requirements.in"
