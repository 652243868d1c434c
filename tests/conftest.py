"""For every test: the modules' shared code (plugins/module_utils) importable as Ansible ships it, and a run
that is stopped (Ctrl-C, `timeout`, a closed terminal) tearing down what it started."""

import os
import signal

import pytest
import simlab
from ansible_modules import use_module_utils

use_module_utils()

# Every lab VM meets unattended-upgrades holding apt's locks after each boot (labsim.network_lab.apt_hold_s), and a
# fresh converge boots each VM twice or more: the test session's labs hold them 8 s instead of the demo's 25 s (the
# wait itself, and its message at length, are proven by tests/lab/labsim/test_netlab_apt_locks.py).
os.environ.setdefault("GPULAB_LAB_APT_HOLD_S", "8")


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def pytest_configure(config):
    """SIGTERM and SIGHUP end the run as Ctrl-C does, in the main process and in each pytest-xdist worker
    (`timeout` and a closed terminal signal the whole process group): pytest then runs every fixture's
    teardown and every `finally`, so each lab a test started (simlab.running_lab, the module fixtures) is taken
    down. Without this, Python dies at once on SIGTERM and the labs' API servers and hosts keep running."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _interrupted)


def _shared_lab_files_in_order(items):
    """Each SHARED_LABS group's tests where its first collected test was, its files in the group's order."""
    first: dict[str, int] = {}
    keys = []
    for index, item in enumerate(items):
        path = _rootdir_path(item)
        group = SHARED_LAB_OF.get(path)
        if group is None:
            keys.append((index, 0, index))
        else:
            keys.append((first.setdefault(group, index), simlab.SHARED_LABS[group].index(path), index))
    items[:] = [item for _, item in sorted(zip(keys, items, strict=True), key=lambda pair: pair[0])]


def _rootdir_path(item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    """In the make targets' pytest-xdist workers: the test files with a lab, real daemons or playbook runs (a test
    marked root or slow) first, each file's tests in their order, the quick files after them, so that the two
    workers share out the long files and finish on the quick ones (run with --no-loadscope-reorder, which keeps
    this order). A plain pytest run keeps the collection order. In both, the files of a simlab.SHARED_LABS group
    run together in the group's order (the first goes on from the lab the second reads, whatever their names)."""
    _shared_lab_files_in_order(items)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    heavy = {
        item.path for item in items if item.get_closest_marker("root") or item.get_closest_marker("slow")
    }
    items.sort(key=lambda item: item.path not in heavy)  # stable: the order within each group stays


@pytest.fixture(scope="session")
def converged_demo():
    """A demo lab after one whole converge, shared by the test files of simlab.SHARED_LABS["converged_demo"]
    (simlab.ConvergedDemo says how)."""
    with simlab.converged_demo() as demo:
        yield demo


#: test file -> the group of files that share a session fixture's lab with it (simlab.SHARED_LABS)
SHARED_LAB_OF = {path: group for group, paths in simlab.SHARED_LABS.items() for path in paths}


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """The make targets' pytest-xdist scheduling: a test file's tests go to one worker (its module fixtures run
    once), and so do all the files of one simlab.SHARED_LABS group (their session fixture runs once)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrSharedLab(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_LAB_OF.get(path, path)

    return FileOrSharedLab(config, log)
