#!/usr/bin/env bash
# `make sanity`: ansible-test sanity on the collection as a user installs it.
#
# Builds the tarball (galaxy.yml's build_ignore decides what ships), installs it into an empty collections path
# outside the checkout (a temporary <dir>/ansible_collections/gpulab/homelab, as ansible-test wants its tree; inside
# the checkout ansible-test would list the files git knows there: none) and runs there every sanity test
# that applies to a collection and runs without containers (--local), with the Python of .venv-sanity: it holds
# the engine (validate-modules reads each controller module's options from it, as Ansible does when it runs one)
# and ansible-test's own pinned tools (--requirements), kept apart from .venv's. ansible-test's import test
# still imports the modules and plugins in a virtualenv of its own, with ansible-core and nothing else.
# Skipped: pslint (PowerShell: the collection has none). Each ignore entry in tests/sanity says why in its line.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$PWD/${GPULAB_SANITY_VENV:-.venv-sanity}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpulab-sanity.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/build"
# --force: the checkout is gpulab.homelab already (ansible.cfg collections_path), so a plain install would skip
"$venv/bin/ansible-galaxy" collection build --output-path "$work/build" . >/dev/null
"$venv/bin/ansible-galaxy" collection install --force -p "$work" "$work"/build/gpulab-homelab-*.tar.gz >/dev/null
cd "$work/ansible_collections/gpulab/homelab"
python=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$venv/bin/ansible-test" sanity --local --requirements --python "$python" \
  --color no --skip-test pslint "$@"
