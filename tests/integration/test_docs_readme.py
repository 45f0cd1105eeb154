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

"Three commands: a head and two nodes" is run the way it says to try it on one machine:
its three commands as three processes, then its client lines (map, nodes) against them.
What is adapted there is said in test_three_commands_on_one_machine.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402

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



def shell_commands(code):
    """The commands of a shell block: continued lines joined, comments and blanks left out."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


class ReadmeThreeCommands(unittest.TestCase):
    """The README's head and two nodes, started on one machine as it says to."""

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="muster-readme-3-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.procs = []
        self.addCleanup(lambda: [harness.stop_process(p) for p in reversed(self.procs)])
        self.env = node_harness.no_gpu_env({k: v for k, v in os.environ.items()
                                            if not k.startswith("MUSTER_")})
        # The head's own local agent takes the machine's lock file, which another agent
        # on this machine (another test's) may hold: it gets one of its own.
        self.env["MUSTER_NODE_LOCK"] = os.path.join(self.work, "head-agent.lock")
        self.ports = {p: str(harness.free_port()) for p in ("7370", "7371", "7372")}

    def adapt(self, command):
        """`command` with its ports free ones and its lock files in the test's dir."""
        command = re.sub(r"127\.0\.0\.1:(737[012])\b",
                         lambda m: "127.0.0.1:" + self.ports[m.group(1)], command)
        return re.sub(r"/tmp/muster-(\w+)\.lock",
                      lambda m: os.path.join(self.work, m.group(1) + ".lock"), command)

    def start(self, command):
        log = open(os.path.join(self.work, "proc-%d.log" % len(self.procs)), "wb")
        self.addCleanup(log.close)
        self.procs.append(subprocess.Popen(["bash", "-c", "exec " + command], env=self.env,
                                           cwd=self.work, stdout=log, stderr=subprocess.STDOUT))

    def logs(self):
        text = ""
        for name in sorted(os.listdir(self.work)):
            if name.endswith(".log"):
                with open(os.path.join(self.work, name), errors="replace") as f:
                    text += "== %s\n%s" % (name, f.read()[-3000:])
        return text

    def test_three_commands_on_one_machine(self):
        blocks = section_blocks("Three commands: a head and two nodes")
        self.assertEqual([lang for lang, _ in blocks], ["sh", "sh", "sh"])
        client, one_machine = blocks[1][1], blocks[2][1]
        commands = shell_commands(one_machine)
        self.assertEqual([c.split()[:2] for c in commands],
                         [["muster", "head"], ["muster", "node"], ["muster", "node"]])
        token = re.search(r"--token (\S+)", commands[0]).group(1)
        binary = os.path.abspath(harness.MUSTER_BIN)
        # Adapted: the binary under test for `muster`; free ports for 7370 to 7372 (the
        # head, which the block leaves at its default port, is given its free one with
        # --listen); the lock files and the nodes' cache and state dirs in the test's
        # dir; two workers a node, not one per core of the machine running the test.
        head = commands[0].replace("muster head", binary + " head", 1)
        self.start(head + " --listen 127.0.0.1:" + self.ports["7370"])
        url = "http://127.0.0.1:" + self.ports["7370"]
        harness.wait_until(lambda: os.path.exists(os.path.join(self.work, "muster-data", "url")),
                           timeout=30, what=lambda: "the head to listen\n" + self.logs())
        for i, command in enumerate(commands[1:]):
            own = " --workers 2 --cache-dir %s --state-dir %s " % (
                os.path.join(self.work, "node%d" % i, "cache"),
                os.path.join(self.work, "node%d" % i, "state"))
            self.start(self.adapt(command.replace("muster node", binary + " node", 1)
                                  .replace(" -- ", own + "-- ", 1)))

        def nodes_up():
            req = urllib.request.Request(url + "/v1/nodes",
                                         headers={"Authorization": "Bearer " + token})
            with urllib.request.urlopen(req, timeout=10) as r:
                nodes = json.loads(r.read())["nodes"]
            up = {n["name"]: n.get("workers") for n in nodes if n["state"] == "active"}
            return up if up.get("b") and up.get("c") else None
        harness.wait_until(nodes_up, timeout=60, what=lambda: "nodes b and c with their "
                           "workers\n" + self.logs())
        # The client lines, with the MUSTER_URL the README says for one machine.
        self.assertIn("export MUSTER_URL=http://10.0.0.1:7370", client)
        code = "alias muster=%s\n%s" % (binary, self.adapt(client.replace(
            "http://10.0.0.1:7370", "http://127.0.0.1:7370")))
        r = subprocess.run(["bash", "-e", "-u", "-o", "pipefail", "-O", "expand_aliases", "-c",
                            code], env=self.env, cwd=self.work, capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, "stderr:\n%s\n%s" % (r.stderr, self.logs()))
        squares = ["%d" % (n * n) for n in range(1, 1001)]
        lines = r.stdout.splitlines()
        start = lines.index("1")
        self.assertEqual(lines[start:start + 1000], squares)
        # `muster nodes`: the head's own agent, without workers, and b and c with theirs.
        rows = [line.split() for line in lines[start + 1000:]]
        self.assertEqual(rows[0][:6], ["NAME", "STATE", "ADDRESS", "CPUS", "GPUS", "WORKERS"])
        active = {row[0]: row for row in rows[1:] if row[1] == "active"}
        self.assertEqual(len(active), 3, r.stdout[-2000:])
        # A loopback address is marked "(local)": it answers on the node's machine only.
        self.assertEqual(active["b"][2:4] + active["b"][6:7],
                         ["127.0.0.1:" + self.ports["7371"], "(local)", "2"])
        self.assertEqual(active["c"][2:4] + active["c"][6:7],
                         ["127.0.0.1:" + self.ports["7372"], "(local)", "2"])
        (own,) = [row for name, row in active.items() if name not in ("b", "c")]
        self.assertEqual(own[2:4] + own[6:7], ["127.0.0.1:" + self.ports["7370"], "(local)", "0"])

if __name__ == "__main__":
    unittest.main()
