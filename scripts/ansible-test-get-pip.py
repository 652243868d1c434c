"""pip for ansible-test's own virtualenvs, from the Python standard library and the package index.

ansible-test makes each virtualenv without pip and runs a bootstrap script in it, which it downloads once from
its CI file server into ~/.ansible/test/cache/get_pip_<version>.py (the path its error message names when the
download fails). CI reaches package registries only, so scripts/sanity.sh puts this script at that path when
none is there: it installs the pip that ships with this Python (ensurepip, offline), then the packages
ansible-test asked for (pip==<version>) from the indexes pip is configured with.

Called as `python get_pip_<version>.py [pip options] PACKAGE...`, like the script it stands in for.
"""

import subprocess
import sys

SKIPPED = {"--no-setuptools", "--no-wheel"}  # nothing but pip is installed anyway


def main() -> None:
    args = [a for a in sys.argv[1:] if a not in SKIPPED]
    subprocess.run(
        [sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL
    )
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], check=True)


if __name__ == "__main__":
    main()
