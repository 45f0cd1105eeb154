"""What a first-time user meets walking the README and docs/cli.md: a listing that
--limit cut short, `put --json FILE` of a file that is not there, an option typed
before the command, the shell worker cli.md shows, and the --max-payload limit as
cli.md states it.

The tests share one head; each uses its own queue.  Nothing waits on a timer: the
shell worker's progress is polled through the queue's counts.
"""
import json
import os
import re
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
CLI_MD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "cli.md")


class CliFirstUseTest(harness.CliHead, unittest.TestCase):
    def counts(self, queue):
        return json.loads(self.ok("queue", "show", queue))["counts"]

    # ---- tasks ls --limit ----------------------------------------------------------

    def test_a_listing_cut_short_says_more_follow(self):
        self.ok("queue", "create", "walk-ls")
        ids = self.ok("put", "--queue", "walk-ls", "a", "b", "c", "d", "e").split()
        r = self.muster("tasks", "ls", "--queue", "walk-ls", "--limit", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([row.split()[0] for row in r.stdout.splitlines()[1:]], ids[:3])
        self.assertEqual(r.stderr, "muster: listed the first 3 tasks; more follow: --after %s "
                         "lists the next ones, --limit 0 lists them all\n" % ids[2])
        r = self.muster("tasks", "ls", "--queue", "walk-ls", "--limit", "3", "--json")
        self.assertEqual(len(r.stdout.splitlines()), 3)
        self.assertIn("more follow: --after %s" % ids[2], r.stderr)
        # The advice reads on from there; a listing that reached the end says nothing.
        r = self.muster("tasks", "ls", "--queue", "walk-ls", "--after", ids[2], "--limit", "3")
        self.assertEqual(([row.split()[0] for row in r.stdout.splitlines()[1:]], r.stderr),
                         (ids[3:], ""))
        for limit in ("5", "0", "100"):
            r = self.muster("tasks", "ls", "--queue", "walk-ls", "--limit", limit)
            self.assertEqual((len(r.stdout.splitlines()), r.stderr), (6, ""), limit)

    def test_a_listing_of_several_pages_cut_short_says_more_follow(self):
        # Past 1000 the CLI reads pages of 1000: the last page, cut to the limit, still
        # knows from the head's `next` that tasks follow.
        self.ok("queue", "create", "walk-pages")
        ids = self.ok("put", "--queue", "walk-pages",
                      stdin="".join("p%d\n" % i for i in range(1003))).split()
        r = self.muster("tasks", "ls", "--queue", "walk-pages", "--limit", "1001", "--json")
        self.assertEqual(len(r.stdout.splitlines()), 1001)
        self.assertIn("listed the first 1001 tasks; more follow: --after %s " % ids[1000],
                      r.stderr)
        r = self.muster("tasks", "ls", "--queue", "walk-pages", "--limit", "0", "--json")
        self.assertEqual((len(r.stdout.splitlines()), r.stderr), (1003, ""))

    # ---- put --json FILE with no such file -----------------------------------------

    def test_put_json_of_a_missing_file_says_there_is_none(self):
        self.ok("queue", "create", "walk-json")
        err = self.fails(1, "put", "--queue", "walk-json", "--json", "jobs.jsn")
        self.assertEqual(err.splitlines(), [
            "muster: invalid_argument: argument 1: not valid JSON: invalid token near 'jobs' "
            "(at column 4)",
            "muster: if 'jobs.jsn' names a file of payloads: there is none (No such file or "
            "directory); --json FILE reads FILE when it exists"])
        # JSON that is only broken is told as such, with no word of files.
        err = self.fails(1, "put", "--queue", "walk-json", "--json", "{bad")
        self.assertEqual(len(err.splitlines()), 1, err)
        # The file, once there, is read, as the hint says.
        with open(os.path.join(self.cwd, "jobs.jsn"), "w") as f:
            f.write('[1, "two"]\n')
        self.assertEqual(len(self.ok("put", "--queue", "walk-json", "--json", "jobs.jsn")
                             .split()), 2)
        self.assertEqual(self.counts("walk-json")["queued"], 2)

    # ---- an option before the command ----------------------------------------------

    def test_an_option_before_the_command_is_said_to_go_after_it(self):
        for words, word in ((["--queue", "q", "put", "a"], "--queue"),
                            (["--token", self.head.token, "--bogus", "queue", "ls"], "--bogus"),
                            (["-V"], "-V")):
            err = self.fails(2, *words)
            self.assertEqual(err, "muster: option '%s' comes before the command: only --url, "
                             "--token and --data-dir may (`muster --token T queue ls`), and "
                             "--help or --version alone; give the others after the command\n"
                             "Try 'muster --help' for the list of commands, and 'muster "
                             "COMMAND --help' for their options.\n" % word, words)
        self.assertNotIn("unknown command", self.fails(2, "--bogus"))
        # What may come first still does.
        self.assertIn("NAME", self.ok("--token", self.head.token, "queue", "ls"))
        self.assertTrue(self.ok("--version").startswith("muster "))

    # ---- cli.md's shell worker -----------------------------------------------------

    def shell_worker_of_cli_md(self):
        with open(CLI_MD, encoding="utf-8") as f:
            text = f.read()
        found = re.search(r"A shell worker, for illustration.*?\n```\n(.*?)```", text, re.S)
        self.assertIsNotNone(found, "docs/cli.md has no shell worker example")
        return found.group(1)

    def test_the_shell_worker_of_cli_md_runs_every_task(self):
        harness.ensure_tool("jq", "jq")
        script = self.shell_worker_of_cli_md()
        self.assertIn("./resize", script)
        self.ok("queue", "create", "resize")
        self.ok("put", "--queue", "resize", "a.jpg", "b.jpg", "c.jpg")
        # The example as written, with `muster` this build and ./resize a stand-in.
        prelude = 'muster() { "%s" "$@"; }\n' % MUSTER
        with open(os.path.join(self.cwd, "resize"), "w") as f:
            f.write("#!/bin/sh\ntr a-z A-Z\n")
        os.chmod(os.path.join(self.cwd, "resize"), 0o755)
        log = os.path.join(self.cwd, "shell-worker.log")
        with open(log, "w") as err:
            proc = subprocess.Popen(["bash", "-c", prelude + script], cwd=self.cwd,
                                    env=harness.cli_env(self.head), stdout=subprocess.DEVNULL,
                                    stderr=err, start_new_session=True)
        try:
            harness.wait_until(lambda: self.counts("resize")["done"] == 3 or
                               proc.poll() is not None, timeout=30,
                               what="the shell worker to complete three tasks")
        finally:
            if proc.poll() is None:  # it loops for ever, as the doc says: stop it
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with open(log) as f:
            self.assertEqual(self.counts("resize")["done"], 3, "it stopped early: " + f.read())
        results = [json.loads(line)["result"] for line in
                   self.ok("tasks", "ls", "--queue", "resize", "--json").splitlines()]
        self.assertEqual(results, ["A.JPG", "B.JPG", "C.JPG"])

    # ---- --max-payload as cli.md states it -----------------------------------------

    def test_max_payload_counts_a_string_as_json_text(self):
        with open(CLI_MD, encoding="utf-8") as f:
            row = next(line for line in f if line.startswith("| `--max-payload BYTES`"))
        self.ok("queue", "create", "walk-big")
        err = self.fails(1, "put", "--queue", "walk-big", stdin="a" * 1048575 + "\n")
        quoted = re.search(r"`(payload_too_large: [^`]*)`", row).group(1)
        self.assertEqual(err, "muster: %s\n" % quoted)
        self.ok("put", "--queue", "walk-big", stdin="a" * 1048574 + "\n")


if __name__ == "__main__":
    unittest.main()
