"""client.shared and the Pool's class through shared data: skipped while the head has
no shared-data API (docs/api.md, "Shared data")."""
import unittest

from common import HeadTestCase, muster


class SharedTest(HeadTestCase):
    def setUp(self):
        super().setUp()
        if not self.c.shared.available():
            self.skipTest("the head does not serve shared data yet")

    def test_levels(self):
        sh = self.c.shared
        r = sh.set("pytest", "weights", b"one")
        self.assertEqual(r["level"], 1)
        with self.assertRaises(muster.VersionMismatch) as cm:
            sh.update("pytest", "weights", b"three", level=3)
        self.assertIn("expected 2, got 3", cm.exception.message)
        sh.update("pytest", "weights", b"two", level=2)
        self.assertEqual(sh.get("pytest", "weights"), b"two")
        data, info = sh.get("pytest", "weights", level=1, with_info=True)
        self.assertEqual((data, info["level"]), (b"one", 1))
        self.assertEqual([b["name"] for b in sh.list("pytest")], ["weights"])
        sh.delete("pytest", "weights")
        with self.assertRaises(muster.SharedNotFound):
            sh.get("pytest", "weights")


if __name__ == "__main__":
    unittest.main()
