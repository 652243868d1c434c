#!/usr/bin/env bash
# `make sanity`: ansible-test sanity on the collection as a user installs it.
#
# Builds the tarball (galaxy.yml's build_ignore decides what ships), installs it into an empty collections path
# outside the checkout (a temporary <dir>/ansible_collections/gpulab/homelab, as ansible-test wants its tree; inside
# the checkout ansible-test would list the files git knows there: none) and runs there every sanity test that
# applies to a collection and runs without containers (--local), with the ansible-test of GPULAB_SANITY_VENV
# (make sanity: .venv-sanity, the newest ansible-core of pyproject's range, then .venv-sanity-min, the lowest;
# each holds the engine as a user's controller does). ansible-test runs each test in a virtualenv of its own
# with its pinned tools (--requirements) and ansible-core, without the engine: the plugins load without it, and
# validate-modules reads every module's arguments from the module file itself (ARGUMENT_SPEC, `make docs`).
# Skipped: pslint (PowerShell: the collection has none). Each ignore entry in tests/sanity says why in its line.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD
venv=$(realpath "${GPULAB_SANITY_VENV:-.venv-sanity}")
work=$(mktemp -d "${TMPDIR:-/tmp}/gpulab-sanity.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/build"
# --force: the checkout is gpulab.homelab already (ansible.cfg collections_path), so a plain install would skip
"$venv/bin/ansible-galaxy" collection build --output-path "$work/build" . >/dev/null
"$venv/bin/ansible-galaxy" collection install --force -p "$work" "$work"/build/gpulab-homelab-*.tar.gz >/dev/null
cd "$work/ansible_collections/gpulab/homelab"
python=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# ansible-test bootstraps pip into each virtualenv of its own with a script it downloads once from its CI file
# server, which is not a package registry (CI reaches those only): where none is cached, the stand-in
# scripts/ansible-test-get-pip.py goes there (ensurepip, then pip==<the version ansible-test asks> from the index)
pip_version=$("$venv/bin/python" -c 'import sys, types; from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version=sys.argv[1]))["pip"])' "$python")
cache=$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py
[ -e "$cache" ] || install -D -m 644 "$checkout/scripts/ansible-test-get-pip.py" "$cache"
"$venv/bin/ansible-test" sanity --local --requirements --python "$python" \
  --color no --skip-test pslint "$@"
