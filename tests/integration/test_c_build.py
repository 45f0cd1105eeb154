"""A C program built against libmuster the two ways docs/client.md ("Building a program")
gives: from an install (`cmake --install BUILD --prefix DIR`, then `pkg-config --cflags
--libs muster`) and from the build dir itself (`-I include -L BUILD -lmuster` with an
rpath).  Each program is compiled, linked and run against a head: it puts a task, leases
and completes it, and prints what a wrong queue name says.  There were no install rules
and no compile line in the docs: a user had to guess both, and a program linked with
-L BUILD alone did not start (libmuster.so.1 not found).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("MUSTER_BUILD_DIR") or os.path.dirname(harness.MUSTER_BIN)

PROGRAM = r"""
#include <muster.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  muster_client_t *c = NULL;
  char *why = NULL;
  if (muster_client_open(argv[1], argv[2], &c, &why) != MUSTER_OK) {
    printf("open: %s\n", why);
    return 1;
  }
  muster_task_spec_t spec;
  muster_task_spec_init(&spec);
  spec.payload = "\"hello\"";
  muster_lease_t *leases = NULL;
  size_t n = 0;
  if (muster_queue_put(c, "built", NULL, NULL) != MUSTER_OK ||
      muster_put(c, "built", &spec, 1, NULL) != MUSTER_OK ||
      muster_lease(c, "built", 0, 1, 0, &leases, &n) != MUSTER_OK || n != 1) {
    printf("failed: %s\n", muster_client_message(c));
    return 1;
  }
  muster_ack_t ack;
  muster_ack_init(&ack, leases[0].task, leases[0].token);
  ack.result = "\"done\"";
  printf("leased %s, complete: %s\n", leases[0].payload, muster_err_name(muster_complete(c, &ack, 1)));
  muster_leases_free(leases, n);
  muster_err_t err = muster_queue_get(c, "no-such-queue", NULL);
  printf("%s: %s\n", muster_err_name(err), muster_client_message(c));
  muster_client_free(c);
  return 0;
}
"""


def sanitized():
    """The flags a program needs to load this build's libmuster: an ASan build's wants
    the sanitizer runtime first."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            on = any(line.strip() == "MUSTER_SANITIZE:BOOL=ON" for line in f)
    except OSError:
        on = False
    return ["-fsanitize=address,undefined"] if on else []


class CBuildTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head().start()

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-c-build-")
        self.source = os.path.join(self.tmp, "prog.c")
        with open(self.source, "w") as f:
            f.write(PROGRAM)
        self.program = os.path.join(self.tmp, "prog")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_program(self, flags):
        cc = subprocess.run(["cc", "-Wall", "-Werror", self.source] + sanitized() + flags +
                            ["-o", self.program], capture_output=True, text=True)
        self.assertEqual(cc.returncode, 0, cc.stderr)
        run = subprocess.run([self.program, self.head.url, self.head.token],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertEqual(run.stdout.splitlines(), [
            'leased "hello", complete: ok',
            "queue_not_found: queue 'no-such-queue' does not exist"])

    def test_installed_with_pkg_config(self):
        prefix = os.path.join(self.tmp, "prefix")
        install = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix],
                                 capture_output=True, text=True)
        self.assertEqual(install.returncode, 0, install.stdout + install.stderr)
        for path in ("bin/muster", "include/muster.h"):
            self.assertTrue(os.path.exists(os.path.join(prefix, path)), path)
        # lib/pkgconfig, or lib/<multiarch>/pkgconfig where GNUInstallDirs picks one
        found = [d for d, _, files in os.walk(prefix) if "muster.pc" in files]
        self.assertEqual(len(found), 1, install.stdout)
        env = dict(os.environ, PKG_CONFIG_PATH=found[0])
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "muster"], check=True,
                               capture_output=True, text=True, env=env).stdout.split()
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "muster"], check=True,
                                capture_output=True, text=True, env=env).stdout.strip()
        self.assertTrue(os.path.exists(os.path.join(libdir, "libmuster.so.1")), libdir)
        at_least = subprocess.run(["pkg-config", "--atleast-version=1.4", "muster"], env=env)
        self.assertEqual(at_least.returncode, 0)
        self.run_program(flags + ["-Wl,-rpath," + libdir])

    def test_from_the_build_dir(self):
        self.run_program(["-I", os.path.join(SOURCE, "include"), "-L", BUILD, "-lmuster",
                          "-Wl,-rpath," + BUILD])


if __name__ == "__main__":
    unittest.main()
