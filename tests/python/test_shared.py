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

    def test_data_that_is_not_bytes_is_refused_before_sending(self):
        """An int would be sent as that many zero bytes, a dict raised a TypeError about
        str and integers: both now say what shared data is, and nothing is stored."""
        sh = self.c.shared
        for value in (5, {"lr": 0.1}, [1, 2], None):
            with self.assertRaises(TypeError) as cm:
                sh.set("pytest", "typed", value)
            # It names the argument, as every refusal of `data` does (docs/python.md).
            self.assertTrue(str(cm.exception).startswith(
                "data: expected bytes (or str), a path (os.PathLike) or a file open in "
                "binary mode, got %s (for shared data 'typed' in scope 'pytest')"
                % type(value).__name__), str(cm.exception))
        with self.assertRaises(muster.SharedNotFound):
            sh.get("pytest", "typed")
        sh.set("pytest", "typed", "text")
        sh.update("pytest", "typed", memoryview(b"view"), level=2)
        self.assertEqual((sh.get("pytest", "typed", level=1), sh.get("pytest", "typed")),
                         (b"text", b"view"))
        sh.delete("pytest", "typed")


if __name__ == "__main__":
    unittest.main()
