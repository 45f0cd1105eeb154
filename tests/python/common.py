"""Shared setup of the Python client tests: the package from the source tree and a
real head started by tests/integration/harness.py (MUSTER_BIN names the binary)."""
import faulthandler
import importlib.util
import os
import sys
import time
import unittest

# A test that waits forever holds its ctest until the kill, and the kill prints nothing
# of where it waited: past the module's deadline the process prints every thread's
# traceback and exits instead.
WATCHDOG_S = float(os.environ.get("MUSTER_TEST_WATCHDOG_S", "540"))
_deadline = time.monotonic() + WATCHDOG_S


def arm_watchdog(seconds=None):
    """Print the tracebacks and exit ``seconds`` from now; None: at the module's deadline."""
    left = _deadline - time.monotonic() if seconds is None else seconds
    faulthandler.dump_traceback_later(max(left, 1.0), exit=True)


arm_watchdog()

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

_spec = importlib.util.spec_from_file_location(
    "muster_test_harness", os.path.join(ROOT, "tests", "integration", "harness.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

import muster  # noqa: E402

os.environ.setdefault("MUSTER_BIN", os.path.abspath(harness.MUSTER_BIN))


class HeadTestCase(unittest.TestCase):
    """One real head per test class; ``self.c`` is a muster.Client of it."""

    head_args = ("--sweep-ms", "50")

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(list(cls.head_args)).start()
        cls.client = muster.Client(cls.head.url, cls.head.token)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.head.cleanup()

    def setUp(self):
        if self.head.proc.poll() is not None:
            self.fail("head exited:\n" + self.head.log())
        self.c = self.client

    def qname(self, suffix=""):
        base = type(self).__name__ + "." + self._testMethodName.replace("test_", "", 1)
        return (base + ("-" + suffix if suffix else ""))[:128]

    def has_route(self, path):
        """False while the head answers a bare not_found for ``path`` (not implemented yet)."""
        try:
            self.c.request("GET", path)
        except muster.MusterError as e:
            return e.code != "not_found"
        return True
