"""README.md's first steps, run as a new user runs them: the "A first pipeline" shell
block (the CLI next to the head's `muster-data`, found without any option), its curl
lines (the token read from `muster-data/token`), and the first lines of the Python
block, each against a head started as the quick start starts it (its own data dir
./muster-data, its token generated there).  The outputs the README promises are
checked: the pipeline's results OLLEH and DLROW in `tasks ls`, the queues in `status`,
the put and the lease of the curl lines.

The blocks are read from README.md (MUSTER_DOCS_TEST_README points at an edited copy):
a change that breaks a first step breaks this test.  Two words are adapted, each said
where it is: `./build/muster` is the binary under test, and the URL of the curl lines
is the test head's (its port is free, not 7370).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
README = os.environ.get("MUSTER_DOCS_TEST_README", os.path.join(ROOT, "README.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
DEFAULT_URL = "http://127.0.0.1:7370"


def section_blocks(title):
    """The fenced blocks (language, code) of README.md's section `## title`."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    start = text.index("\n## " + title + "\n")
    end = text.find("\n## ", start + 1)
    return FENCE.findall(text[start:end if end >= 0 else len(text)])


class ReadmeFirstSteps(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="muster-readme-")
        self.addCleanup(shutil.rmtree, self.work, True)
        # As `make run` starts it: ./muster-data, no --token (one is generated there).
        self.head = harness.Head(data_dir=os.path.join(self.work, "muster-data"), token=None)
        os.mkdir(self.head.data_dir)
        self.head.start()
        self.addCleanup(self.head.cleanup)
        with open(os.path.join(self.head.data_dir, "token")) as f:
            self.head.token = f.read().strip()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        self.env.update(PYTHONPATH=os.path.join(ROOT, "python"), PYTHONDONTWRITEBYTECODE="1")

    def run_sh(self, code):
        # `alias muster=./build/muster`: the binary under test, wherever it was built.
        code = code.replace("alias muster=./build/muster",
                            "alias muster=%s" % os.path.abspath(harness.MUSTER_BIN))
        code = code.replace(DEFAULT_URL, self.head.url)  # the test head's free port
        r = subprocess.run(["bash", "-e", "-u", "-o", "pipefail", "-O", "expand_aliases", "-c",
                            code], env=self.env, cwd=self.work, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, "stdout:\n%s\nstderr:\n%s" % (r.stdout, r.stderr))
        return r.stdout

    def test_a_first_pipeline_with_the_cli(self):
        (lang, code), (curl_lang, curl) = section_blocks("A first pipeline")
        self.assertEqual((lang, curl_lang), ("sh", "sh"))
        self.assertIn("alias muster=./build/muster", code)
        out = self.run_sh(code)
        # `tasks ls --state done` of the last stage: each word upper-cased, then reversed.
        rows = [line.split() for line in out.splitlines()]
        done = [r for r in rows if len(r) == 6 and r[1] == "done"]
        self.assertEqual(sorted(r[5] for r in done), ["DLROW", "OLLEH"], out)
        self.assertIn("head:    %s  ok" % self.head.url, out)
        self.assertRegex(out, r"\nreversed +0 +0 +2 +0 +0 +0 +-\n")
        self.assertRegex(out, r"\nupper +0 +0 +2 +0 +0 +0 +reversed\n")
        # The curl lines: a put, then its lease, with the token of muster-data/token.
        self.assertIn(DEFAULT_URL, curl)
        put, lease = [json.loads(line) for line in self.run_sh(curl).splitlines()]
        self.assertTrue(put["tasks"][0]["created"], put)
        self.assertEqual([(x["task"], x["payload"]) for x in lease["leases"]],
                         [(put["tasks"][0]["id"], "hi")])

    def test_the_python_lines(self):
        # The block's first lines, up to its first blank line (the pool below needs a
        # worker class and node agents of its own, docs/python.md has them).
        blocks = [code for lang, code in section_blocks("Python") if lang == "python"]
        first = blocks[0].split("\n\n")[0]
        self.assertIn("muster.Client()", first)
        # After the first pipeline: its queues, upper and its next stage reversed.
        for queue, body in (("reversed", {}), ("upper", {"next": "reversed"})):
            r = self.head.request("PUT", "/v1/queues/" + queue, body)
            self.assertEqual(r.status, 201, r.json)
        path = os.path.join(self.work, "first.py")
        with open(path, "w") as f:
            f.write(first + "\n")
        r = subprocess.run(["/usr/bin/python3", path], env=self.env, cwd=self.work,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        # The task put is done, and its result became a task of the pipeline's next
        # stage, as the README says of `muster.init(stage="a", pipeline="upper")`.
        upper = self.head.request("GET", "/v1/queues/upper/tasks").json["tasks"]
        self.assertEqual([(t["payload"], t["state"], t["result"]) for t in upper],
                         [("hello", "done", "HELLO")], r.stderr)
        nxt = self.head.request("GET", "/v1/queues/reversed/tasks").json["tasks"]
        self.assertEqual([t["payload"] for t in nxt], ["HELLO"])


if __name__ == "__main__":
    unittest.main()
