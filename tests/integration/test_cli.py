"""The `muster` command line against a real head: every command, its errors, and the
worker runner processing pipelines with real commands.

Each test uses its own queues, so the tests share one head.  Nothing waits on a
timer: the tests poll state with harness.wait_until or wait for processes to exit.
"""
import json
import os
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402

MUSTER = harness.MUSTER_BIN

COMMANDS = [
    [], ["head"], ["queue"], ["queue", "create"], ["queue", "ls"], ["queue", "show"],
    ["queue", "purge"], ["queue", "rm"], ["queue", "requeue"], ["put"], ["lease"],
    ["complete"], ["fail"], ["extend"], ["release"], ["flag"], ["tasks"], ["tasks", "ls"],
    ["tasks", "show"], ["tasks", "dead"], ["tasks", "requeue"], ["worker"], ["status"],
    ["version"], ["help"],
]

# A command for the worker that signals it started (a file named after the task),
# then waits for DIR/go before copying its input to its output.
BLOCKING = ('touch "$1/started-$MUSTER_TASK_ID"; n=0; '
            'while [ ! -e "$1/go" ]; do sleep 0.01; n=$((n+1)); '
            '[ $n -gt 3000 ] && exit 9; done; cat')

# For the worker's first attempt of a task: a shell that starts a grandchild, says
# both pids in DIR/pids (written whole, by rename) and blocks; later attempts copy
# their input to their output.
ORPHAN_CANDIDATE = ('if [ "$MUSTER_ATTEMPT" != 1 ]; then exec cat; fi; '
                    'sleep 600 & echo "$$ $!" > "$1/pids.tmp"; mv "$1/pids.tmp" "$1/pids"; wait')


class CliTest(harness.CliHead, unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-cli-")
        self.procs = []

    def tearDown(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- helpers -------------------------------------------------------------------

    def env(self, url=True, token=True):
        return harness.cli_env(self.head, url, token)

    def muster(self, *args, stdin=None, url=True, token=True, cwd=None):
        """Runs the CLI and returns the CompletedProcess (text mode)."""
        return subprocess.run([MUSTER] + list(args), input=stdin, capture_output=True, text=True,
                              env=self.env(url, token), cwd=cwd or self.cwd, timeout=60)

    def queue(self, suffix="", *opts):
        name = self.id().rsplit(".", 1)[-1].replace("_", "-") + suffix
        self.ok("queue", "create", name, *opts)
        return name

    def api(self, method, path, body=None):
        reply = self.head.request(method, path, body)
        self.assertLess(reply.status, 300, reply)
        return reply.json

    def tasks(self, queue, state=None):
        path = "/v1/queues/%s/tasks?limit=1000" % queue + ("&state=" + state if state else "")
        return self.api("GET", path)["tasks"]

    def counts(self, queue):
        return self.api("GET", "/v1/queues/" + queue)["counts"]

    def worker(self, queue, *cmd, opts=()):
        """Starts `muster worker`; its stderr goes to a log file (see log_of)."""
        log = open(os.path.join(self.tmp, "worker-%d.log" % len(self.procs)), "w+")
        proc = subprocess.Popen([MUSTER, "worker", "--queue", queue] + list(opts) + ["--"]
                                + list(cmd), env=self.env(), cwd=self.cwd,
                                stdout=subprocess.DEVNULL, stderr=log)
        proc.log = log
        self.procs.append(proc)
        return proc

    def log_of(self, proc):
        with open(proc.log.name) as f:
            return f.read()

    def finish(self, proc, timeout=60):
        """Waits for the worker to exit 0 and returns what it wrote to stderr."""
        proc.wait(timeout=timeout)
        proc.log.close()
        err = self.log_of(proc)
        self.assertEqual(proc.returncode, 0, err)
        return err

    # ---- help and usage ----------------------------------------------------------------

    def test_help_of_every_command(self):
        for words in COMMANDS:
            for flag in ("--help", "-h"):
                r = self.muster(*(words + [flag]))
                self.assertEqual(r.returncode, 0, (words, r.stderr))
                self.assertIn("usage: muster", r.stdout, words)
        for words in COMMANDS[1:]:
            r = self.muster("help", *words)
            self.assertEqual(r.returncode, 0, (words, r.stderr))
            self.assertIn("usage: muster", r.stdout)
        self.assertIn("--concurrency", self.ok("worker", "--help"))
        self.assertIn("--listen", self.ok("head", "--help"))
        # The schema is the one a head of this binary gives its data dir.
        schema = self.head.request("GET", "/v1/health").json["schema"]
        self.assertEqual(self.ok("version").strip(), "muster 0.1.0 (data dir schema %d)" % schema)

    def test_usage_errors_exit_2(self):
        cases = [
            (["bogus"], "unknown command 'bogus'"),
            (["queue"], "needs a subcommand"),
            (["queue", "bogus"], "unknown subcommand 'queue bogus'"),
            (["queue", "create"], "needs"),
            (["queue", "show", "a", "b"], "unexpected argument 'b'"),
            (["put", "--queue", "q", "--bogus", "x"], "unknown option '--bogus'"),
            (["put", "--queue"], "needs a value"),
            (["put", "x"], "needs --queue"),
            (["put", "--queue", "q", "--priority", "high", "x"], "expected an integer"),
            (["lease", "--queue", "q", "--max", "0"], "at least 1"),
            (["complete", "1"], "needs"),
            (["complete", "x", "1"], "TASK: expected an integer"),
            (["tasks", "requeue"], "either ID or --queue"),
            (["tasks", "requeue", "5", "--queue", "q"],
             "'tasks requeue': ID and --queue Q exclude each other"),
            (["worker", "--queue", "q"], "needs"),
            (["worker", "--queue", "q", "cat", "-n"], "unknown option '-n'"),
            (["status", "--json"], "unknown option '--json'"),
        ]
        for args, message in cases:
            err = self.fails(2, *args)
            self.assertIn(message, err, args)
            self.assertIn("--help", err, args)

    # ---- queues ----------------------------------------------------------------------------

    def test_queue_commands(self):
        q = self.queue("", "--lease-ms", "5000", "--max-attempts", "3")
        shown = json.loads(self.ok("queue", "show", q))
        self.assertEqual((shown["lease_ms"], shown["max_attempts"]), (5000, 3))
        nxt = self.queue("-next")
        created = json.loads(self.ok("queue", "create", q, "--next", nxt, "--backoff-ms", "7",
                                     "--backoff-max-ms", "70", "--max-flags", "2"))
        self.assertEqual(created["next"], nxt)
        self.assertEqual((created["lease_ms"], created["backoff_ms"], created["max_flags"]),
                         (5000, 7, 2))
        self.ok("put", "--queue", q, "a", "b", "c")
        table = self.ok("queue", "ls").splitlines()
        self.assertEqual(table[0].split(), ["NAME", "QUEUED", "LEASED", "DONE", "FAILED", "DEAD",
                                            "CANCELLED", "NEXT"])
        row = [line.split() for line in table if line.split()[0] == q]
        self.assertEqual(row, [[q, "3", "0", "0", "0", "0", "0", nxt]])
        listed = json.loads(self.ok("queue", "ls", "--json"))["queues"]
        self.assertIn(q, [x["name"] for x in listed])
        self.assertEqual(self.ok("queue", "purge", q).strip(), "purged 3 queued tasks from " + q)
        self.assertEqual(self.counts(q)["queued"], 0)
        self.ok("put", "--queue", q, "d")
        self.assertEqual(self.ok("queue", "purge", q).strip(), "purged 1 queued task from " + q)
        self.assertIn("queue_in_use", self.fails(1, "queue", "rm", nxt))
        created = json.loads(self.ok("queue", "create", q, "--next", ""))
        self.assertIsNone(created["next"])
        self.assertEqual(self.ok("queue", "rm", q).strip(), "deleted queue " + q)
        err = self.fails(1, "queue", "show", q)
        self.assertTrue(err.startswith("muster: queue_not_found: "), err)
        self.assertIn("name_invalid", self.fails(1, "queue", "create", "bad/name"))
        self.assertIn("invalid_argument",
                      self.fails(1, "queue", "create", nxt, "--next", nxt))

    def test_status(self):
        q = self.queue()
        out = self.ok("status")
        self.assertIn("head:    " + self.head.url, out)
        self.assertIn(" ok ", out)
        schema = self.head.request("GET", "/v1/health").json["schema"]
        self.assertRegex(out, r"  version \S+ \(schema %d\)  up " % schema)
        self.assertRegex(out, r"workers: \d+ active")
        self.assertIn(q, out)

    # ---- put ---------------------------------------------------------------------------------

    def test_put_from_arguments(self):
        q = self.queue()
        ids = [int(x) for x in self.ok("put", "--queue", q, "hello", "two words", "-5").split()]
        self.assertEqual(len(ids), 3)
        tasks = self.tasks(q)
        self.assertEqual([t["id"] for t in tasks], ids)
        self.assertEqual([t["payload"] for t in tasks], ["hello", "two words", "-5"])
        json_ids = self.ok("put", "--queue", q, "--json", '{"a": [1, 2]}', "-5", '"s"').split()
        payloads = [self.api("GET", "/v1/tasks/" + i)["payload"] for i in json_ids]
        self.assertEqual(payloads, [{"a": [1, 2]}, -5, "s"])
        first = self.ok("put", "--queue", q, "--key", "k1", "--priority", "9", "--delay-ms",
                        "60000", "--", "--not-an-option").strip()
        again = self.ok("put", "--queue", q, "--key", "k1", "other").strip()
        self.assertEqual(first, again)
        task = self.api("GET", "/v1/tasks/" + first)
        self.assertEqual((task["payload"], task["priority"], task["key"]),
                         ("--not-an-option", 9, "k1"))
        self.assertGreater(task["run_at_ms"], task["created_ms"] + 50000)
        self.assertIn("--key names one task", self.fails(2, "put", "--queue", q, "--key", "k",
                                                         "a", "b"))

    def test_put_from_stdin_in_batches(self):
        q = self.queue()
        out = self.ok("put", "--queue", q, stdin="alpha\n\nbeta\r\ngamma")
        self.assertEqual(len(out.split()), 3)
        self.assertEqual([t["payload"] for t in self.tasks(q)], ["alpha", "beta", "gamma"])
        lines = "".join('{"n": %d}\n' % i for i in range(2500))
        ids = self.ok("put", "--queue", q, "--json", stdin=lines).split()
        self.assertEqual(len(ids), 2500)
        self.assertEqual(len(set(ids)), 2500)
        self.assertEqual(self.counts(q)["queued"], 2503)
        last = self.api("GET", "/v1/tasks/" + ids[-1])
        self.assertEqual(last["payload"], {"n": 2499})

    def test_put_bad_json_sends_nothing(self):
        q = self.queue()
        err = self.fails(1, "put", "--queue", q, "--json", stdin='{"ok": 1}\n[2]\n{bad\n3\n')
        self.assertIn("invalid_argument", err)
        self.assertIn("stdin line 3", err)
        err = self.fails(1, "put", "--queue", q, "--json", "1", "nope")
        self.assertIn("argument 2", err)
        self.assertEqual(self.tasks(q), [])

    def test_unknown_queue(self):
        # Said with how to make it, as `muster worker` says it; but not to `queue rm`,
        # which says only where the queues are listed.
        advice = ("muster: create it with `muster queue create no-such-queue` (or see `muster "
                  "queue ls` for the queues there are)\n")
        for args in (("put", "--queue", "no-such-queue", "x"), ("lease", "--queue", "no-such-queue"),
                     ("tasks", "ls", "--queue", "no-such-queue"),
                     ("session", "create", "--queue", "no-such-queue"),
                     ("queue", "show", "no-such-queue")):
            with self.subTest(args=args):
                err = self.fails(1, *args)
                self.assertEqual(err, "muster: queue_not_found: queue 'no-such-queue' does not "
                                 "exist\n" + advice)
        self.assertEqual(self.fails(1, "queue", "rm", "no-such-queue"),
                         "muster: queue_not_found: queue 'no-such-queue' does not exist\n"
                         "muster: see `muster queue ls` for the queues there are\n")
        self.assertIn("queue_not_found", self.fails(1, "worker", "--queue", "no-such-queue",
                                                    "--", "cat"))

    # ---- url and token -------------------------------------------------------------------------

    def test_missing_or_wrong_token(self):
        err = self.fails(1, "queue", "ls", token=False)
        self.assertIn("muster: unauthorized: ", err)
        self.assertIn("no token was given", err)
        err = self.fails(1, "queue", "ls", "--token", "wrong-token-123")
        self.assertIn("muster: unauthorized: ", err)
        self.assertNotIn("no token was given", err)
        # The health line needs no token and the listings do: status fetches all before
        # printing, so a wrong token prints the error alone, no health line that reads
        # as success before it.
        for args, kw in ((["status"], {"token": False}),
                         (["status", "--token", "wrong-token-123"], {})):
            r = self.muster(*args, **kw)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertEqual(r.stdout, "")
            self.assertTrue(r.stderr.startswith("muster: unauthorized: "), r.stderr)

    def test_url_and_token_from_data_dir(self):
        data = os.path.join(self.tmp, "muster-data")
        os.mkdir(data)
        with open(os.path.join(data, "url"), "w") as f:
            f.write(self.head.url + "\n")
        with open(os.path.join(data, "token"), "w") as f:
            f.write(self.head.token + "\n")
        q = self.queue()
        # ./muster-data in the working directory is found automatically ...
        out = self.ok("queue", "show", q, url=False, token=False, cwd=self.tmp)
        self.assertEqual(json.loads(out)["name"], q)
        # ... and --data-dir names another one.
        out = self.ok("queue", "show", q, "--data-dir", data, url=False, token=False)
        self.assertEqual(json.loads(out)["name"], q)
        # --url and --token win over the environment.
        r = self.muster("queue", "show", q, "--url", self.head.url, "--token", self.head.token,
                        url=False, token=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        err = self.fails(1, "status", "--url", "http://127.0.0.1:1")
        self.assertIn("muster: network: ", err)

    def test_url_is_checked_before_any_request(self):
        # A URL that cannot name a head is refused up front (exit 2), naming where it
        # came from, instead of as a network error about a host "v1" or a 404 about
        # /v1/v1/queues.
        for url, why in (("http://", "names no host"), ("https://", "names no host"),
                         ("http://:7370", "names no host"),
                         ("127.0.0.1:7370", "must start with http:// or https://"),
                         ("ftp://127.0.0.1:7370", "must start with http:// or https://"),
                         ("http://127.0.0.1:0", "port must be a number from 1 to 65535"),
                         ("http://127.0.0.1:70000", "port must be a number from 1 to 65535"),
                         ("http://127.0.0.1:7370/?x=1", "query"),
                         ("http://127.0.0.1:7370/v1", "must not end in /v1"),
                         ("http://127.0.0.1:7370/v1/", "must not end in /v1")):
            with self.subTest(url=url):
                err = self.fails(2, "queue", "ls", "--url", url)
                self.assertTrue(err.startswith("muster: --url '%s' is not a head's URL" % url),
                                err)
                self.assertIn(why, err)
        env = self.env(url=False)
        env["MUSTER_URL"] = "http://"
        r = subprocess.run([MUSTER, "queue", "ls"], capture_output=True, text=True, env=env,
                           cwd=self.cwd, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("muster: MUSTER_URL 'http://' is not a head's URL", r.stderr)
        data = os.path.join(self.tmp, "muster-data")
        os.mkdir(data)
        with open(os.path.join(data, "url"), "w") as f:
            f.write(self.head.url + "/v1\n")
        err = self.fails(2, "queue", "ls", url=False, cwd=self.tmp)
        self.assertIn("muster-data/url '%s/v1' is not a head's URL" % self.head.url, err)
        # A trailing slash is fine, and so is a proxy's path prefix (it reaches a
        # server that says what is there).
        self.ok("queue", "ls", "--url", self.head.url + "/")
        err = self.fails(1, "queue", "ls", "--url", self.head.url + "/prefix")
        self.assertIn("muster: not_found: no endpoint at /prefix/v1/queues", err)

    def test_shared_rm_counts_levels(self):
        self.ok("shared", "put", "cli-rm", "one", stdin="a")
        self.assertEqual(self.ok("shared", "rm", "cli-rm", "one").strip(),
                         "deleted cli-rm/one (1 level)")
        self.ok("shared", "put", "cli-rm", "two", stdin="a")
        self.ok("shared", "put", "cli-rm", "two", "--level", "2", stdin="b")
        self.assertEqual(self.ok("shared", "rm", "cli-rm", "two").strip(),
                         "deleted cli-rm/two (2 levels)")

    def test_shared_put_json_is_the_heads_reply(self):
        # --json prints the put's reply as the other --json outputs print theirs
        # (indented), every field of the level as the head holds it.
        out = self.ok("shared", "put", "cli-json", "blob", "--json", "--ttl-ms", "60000",
                      stdin="abc")
        self.assertTrue(out.startswith("{\n  \"scope\": \"cli-json\",\n"), out)
        put = json.loads(out)
        (listed,) = json.loads(self.ok("shared", "ls", "cli-json", "--json"))["blobs"]
        self.assertEqual((put["scope"], put["name"], put["level"], put["size"], put["ttl_ms"],
                          put["ttl_clamped"]), ("cli-json", "blob", 1, 3, 60000, False))
        self.assertEqual((put["checksum"], put["expires_ms"]),
                         (listed["checksum"], listed["expires_ms"]))

    def test_https_to_the_plain_head(self):
        # An https:// URL to the head (which serves plain HTTP) fails at once with the
        # fix named: the head refuses the TLS handshake without waiting for a line end
        # (30 s), and the CLI reads OpenSSL's "wrong version number" for the user.
        url = self.head.url.replace("http://", "https://", 1)
        err = self.fails(1, "status", "--url", url)
        self.assertIn("use an http:// URL", err)

    def test_url_of_another_http_server(self):
        # A server that answers without muster's error envelope is named, with the
        # request, as likely not a muster head; no empty "HTTP 404: " message.
        with harness.not_muster_server() as url:
            err = self.fails(1, "queue", "ls", "--url", url)
        self.assertEqual(err.strip(), "muster: not_found: the server at %s answered HTTP 404 "
                         "to GET /v1/queues without a muster error body: it is likely not "
                         "a muster head; check the URL and its path" % url)

    def test_head_refuses_a_bad_option_in_one_line(self):
        for args, line in (
                (["--bogus"], "muster head: unrecognized option '--bogus'; "
                              "see 'muster head --help'"),
                (["--listen"], "muster head: missing value for option '--listen'; "
                               "see 'muster head --help'"),
                (["--metrics-public=1"], "muster head: option '--metrics-public' takes no "
                                         "value; see 'muster head --help'")):
            with self.subTest(args=args):
                err = self.fails(2, "head", *args, cwd=self.tmp)
                self.assertEqual(err, line + "\n")
                self.assertFalse(os.path.exists(os.path.join(self.tmp, "muster-data")))

    def test_head_refuses_a_bad_value_saying_what_it_takes(self):
        # A value the head refuses is told with what the option takes (the smallest
        # numbers are in no help), a mistyped option with the one it likely is, and a
        # number too large for 64 bits is refused, not clamped to the largest.
        for args, says in (
                (["--listen", "7370"], "invalid value '7370' for --listen: expected ADDR:PORT, "
                                       "such as 127.0.0.1:7370 (0.0.0.0:7370: every "
                                       "interface; port 0 picks a free one)"),
                (["--sync", "fast"], "invalid value 'fast' for --sync: expected full or normal"),
                (["--log-level", "verbose"], "expected debug, info, warn or error"),
                (["--worker-timeout-ms", "5"], "invalid value '5' for --worker-timeout-ms: "
                                               "expected a whole number of milliseconds, "
                                               "from 100 to 9223372036854775807"),
                (["--max-body", "99999999999999999999"],
                 "expected a whole number of bytes, from 1024 to 9223372036854775807"),
                (["--lisen", "127.0.0.1:0"], "unrecognized option '--lisen' (did you mean "
                                             "'--listen'?)"),
                # A name given in part, which getopt_long took (the other commands take
                # names whole): refused, its whole name suggested, by either spelling.
                (["--worker-timeout", "5000"], "unrecognized option '--worker-timeout' "
                                               "(did you mean '--worker-timeout-ms'?)"),
                (["--server-only", "--lis=127.0.0.1:0"], "unrecognized option '--lis' (did "
                                                         "you mean '--listen'?)"),
                # The local agent's options are offered too, not only the head's own;
                # a head option's value that starts with "--" is no option.
                (["--quue", "q"], "unrecognized option '--quue' (did you mean '--queue'?)"),
                (["--workerz=2"], "unrecognized option '--workerz' (did you mean "
                                  "'--workers'?)"),
                (["--server-only", "--gpu", "0"], "unrecognized option '--gpu' (did you mean "
                                                  "'--gpus'?)"),
                (["--token", "--gpus-x--", "--sync-lease"], "unrecognized option "
                                                            "'--sync-lease' (did you mean "
                                                            "'--sync-leases'?)")):
            with self.subTest(args=args):
                err = self.fails(2, "head", *args, cwd=self.tmp)
                self.assertEqual(err.count("\n"), 1, err)
                self.assertIn(says, err)
                self.assertTrue(err.endswith("; see 'muster head --help'\n"), err)
                self.assertFalse(os.path.exists(os.path.join(self.tmp, "muster-data")))
        # --distcompute says its own rule, once: no second, vaguer line after it.
        err = self.fails(2, "head", "--distcompute", "bad", cwd=self.tmp)
        self.assertEqual(err, "muster head: --distcompute takes NAME=QUEUE_A,QUEUE_B,...\n")

    def test_head_on_a_port_in_use_says_what_to_do(self):
        port = self.head.url.rsplit(":", 1)[1]
        err = self.fails(1, "head", "--server-only", "--listen", "127.0.0.1:" + port,
                         "--data-dir", os.path.join(self.tmp, "second"), cwd=self.tmp)
        self.assertIn("cannot listen on 127.0.0.1:%s: Address already in use: another process "
                      "(another head?) listens there; stop it, or give another port with "
                      "--listen (port 0 picks a free one)" % port, err)

    def head_until(self, args, says, env=None):
        """Starts `muster head ARGS` in self.tmp, its stdout and stderr into one file,
        until that output holds `says`; stops it and returns the output."""
        out = tempfile.TemporaryFile("w+")
        self.addCleanup(out.close)
        proc = subprocess.Popen([MUSTER, "head"] + list(args), stdout=out, stderr=out,
                                text=True, cwd=self.tmp,
                                env=env or self.env(url=False, token=False))
        self.addCleanup(harness.stop_process, proc)

        def output():
            # Read at an offset, never seek: the head writes through the same open file,
            # and a seek to 0 would make its next line overwrite the start of the output.
            got, chunk = b"", b"-"
            while chunk:
                chunk = os.pread(out.fileno(), 65536, len(got))
                got += chunk
            return got.decode(errors="replace")
        harness.wait_until(lambda: says in output(), timeout=30, what=says)
        harness.stop_process(proc)
        return output()

    def test_head_option_given_twice_keeps_the_last_and_says_so(self):
        # A wrapper's defaults before the user's options: the last value wins, as for
        # every other command, which said so while the head's own parser said nothing.
        d1, d2 = os.path.join(self.tmp, "twice-1"), os.path.join(self.tmp, "twice-2")
        out = self.head_until(["--server-only", "--listen", "127.0.0.1:0", "--data-dir", d1,
                               "--sweep-ms", "100", "--data-dir=" + d2, "--sweep-ms=300",
                               "--token", "first-secret", "--token", "second-secret",
                               "--sync", "full", "--sync", "full"], "listening on")
        said = [line for line in out.splitlines() if "given twice" in line]
        self.assertEqual(said, [
            "muster head: option '--data-dir' was given twice, '%s' and then '%s': using '%s' "
            "(it takes one value)" % (d1, d2, d2),
            "muster head: option '--sweep-ms' was given twice, '100' and then '300': using "
            "'300' (it takes one value)",
            "muster head: option '--token' was given twice, with two different values: using "
            "the last (it takes one value)"], out)
        self.assertNotIn("first-secret", out)  # a token never reaches the log
        self.assertFalse(os.path.exists(d1))
        with open(os.path.join(d2, "token")) as f:
            self.assertEqual(f.read(), "second-secret\n")

    def test_head_local_agent_option_given_twice_is_said_once(self):
        # The local agent's options are parsed by the head's process and were parsed
        # again by the agent: the line came twice.
        out = self.head_until(["--listen", "127.0.0.1:0", "--data-dir",
                               os.path.join(self.tmp, "agent-twice"), "--lock-file",
                               os.path.join(self.tmp, "agent-twice.lock"), "--queue", "a",
                               "--queue", "b", "--workers", "1", "--", "true"],
                              "started 1 worker on queue b",
                              env=node_harness.no_gpu_env(self.env(url=False, token=False)))
        said = [line for line in out.splitlines() if "given twice" in line]
        self.assertEqual(said, ["muster: option '--queue' was given twice, 'a' and then 'b': "
                                "using 'b' (it takes one value)"], out)

    def banner_of_head(self, *args):
        """Starts `muster head --server-only ARGS` in self.tmp; its banner lines, until its
        CLI hint ("or:" line) and the next one, and the process (to stop)."""
        proc = subprocess.Popen([MUSTER, "head", "--server-only"] + list(args),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                cwd=self.tmp, env=self.env(url=False, token=False))
        self.addCleanup(lambda: proc.poll() is None and (proc.send_signal(signal.SIGINT),
                                                         proc.communicate(timeout=60)))
        lines = []
        while not lines or not lines[-1].startswith("  or:"):
            line = proc.stdout.readline()
            self.assertTrue(line, "the head ended its banner early: %r" % lines)
            lines.append(line.rstrip("\n"))
        return lines, proc

    def test_head_banner_cli_hint_works_where_it_says(self):
        # The CLI reads ./muster-data unless told another data dir: the banner's command
        # names the head's --data-dir (quoted for the shell), and it works as printed.
        absolute = os.path.join(self.tmp, "abs data")
        for data, where in (("rel'dir", self.tmp), (absolute, "/")):
            with self.subTest(data=data):
                lines, _ = self.banner_of_head("--listen", "127.0.0.1:0", "--data-dir", data)
                hint = lines[-1][len("  or:"):].strip()
                command = hint.split("   (")[0]
                self.assertTrue(command.startswith("muster status --data-dir "), hint)
                self.assertEqual(hint.endswith("(run here: it reads the URL and token there)"),
                                 where == self.tmp, hint)
                r = subprocess.run(["/bin/sh", "-c", command.replace("muster", MUSTER, 1)],
                                   capture_output=True, text=True, cwd=where, timeout=60,
                                   env=self.env(url=False, token=False))
                self.assertEqual(r.returncode, 0, (command, r.stderr))
        lines, _ = self.banner_of_head("--listen", "127.0.0.1:0")  # the default data dir
        self.assertEqual(lines[-1], "  or:        muster status   (run here: it reads the URL "
                                    "and token in ./muster-data)")

    def test_head_banner_on_every_interface_names_this_host(self):
        lines, proc = self.banner_of_head("--listen", "0.0.0.0:0", "--data-dir", "d")
        port = lines[0].rsplit(":", 1)[1]
        proc.send_signal(signal.SIGINT)  # (the rest of the banner comes before it stops)
        self.assertEqual(proc.stdout.readline(),
                         "  others:    http://%s:%s (this machine's name or address; for --url "
                         "and muster node --join)\n" % (socket.gethostname(), port))

    def test_head_says_the_token_rule(self):
        # A token that is too short or too long gets the rule, not the secret echoed back.
        for option in ("--token", "--dashboard-token"):
            for value in ("short", "x" * 256):
                with self.subTest(option=option, length=len(value)):
                    err = self.fails(2, "head", "--server-only", option, value, cwd=self.tmp)
                    self.assertEqual(err, "muster head: %s must be 8 to 255 characters long "
                                          "(this one has %d); see 'muster head --help'\n"
                                     % (option, len(value)))
        # One an HTTP header cannot carry: the rule and where, never the value.
        for value, what in (("open sesame", "character 5 is a space"),
                            ("tab\there-token", "character 4 is a control character"),
                            ("caf\u00e9-token", "character 4 is not ASCII")):
            with self.subTest(value=value):
                err = self.fails(2, "head", "--server-only", "--token", value, cwd=self.tmp)
                self.assertEqual(err, "muster head: --token must be visible ASCII characters "
                                      "without spaces, as an HTTP header carries it (%s); see "
                                      "'muster head --help'\n" % what)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "muster-data")))

    def test_head_refuses_a_bad_token_file_and_says_how_to_mend_it(self):
        data = os.path.join(self.tmp, "data")
        os.makedirs(data)
        with open(os.path.join(data, "token"), "w") as f:
            f.write("short\n")
        r = subprocess.run([MUSTER, "head", "--server-only", "--listen", "127.0.0.1:0",
                            "--data-dir", data], capture_output=True, text=True, timeout=60,
                           env=self.env(url=False, token=False))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("the token in %s/token must be 8 to 255 characters long (this one has 5): "
                      "correct it, or remove the file and a new one is generated" % data,
                      r.stderr)
        self.assertFalse(os.path.exists(os.path.join(data, "muster.db")))

    def test_head_banner_curl_line_quotes_the_token(self):
        token = "it's-a-token"
        lines, _ = self.banner_of_head("--listen", "127.0.0.1:0", "--data-dir", "q",
                                       "--token", token)
        curl = [line for line in lines if line.startswith("  try:")][0][len("  try:"):]
        words = shlex.split(curl)
        self.assertEqual(words[:3], ["curl", "-H", "Authorization: Bearer " + token], curl)
        self.assertTrue(words[3].endswith("/v1/queues"), curl)

    def test_head_banner_gives_the_dashboard_url(self):
        # The banner named the API's URL and a curl line, but not where the dashboard is.
        for extra, who in (([], "the token above"),
                           (["--dashboard-token", "read-only-token"],
                            "the --dashboard-token, or the token above")):
            with self.subTest(extra=extra):
                lines, _ = self.banner_of_head("--listen", "127.0.0.1:0", "--data-dir",
                                               "dash%d" % len(extra), *extra)
                url = lines[0].rsplit(" ", 1)[1]
                self.assertIn("  dashboard: %s/   (sign in with %s)" % (url, who), lines)
                with urllib.request.urlopen(url + "/", timeout=30) as page:
                    self.assertEqual(page.status, 200)
                    self.assertIn("text/html", page.headers["Content-Type"])

    def test_head_on_a_port_in_use_makes_no_data_dir(self):
        # The head listens before it makes its data dir, token and store: a port in
        # use fails with one line and leaves nothing behind.
        port = int(self.head.url.rsplit(":", 1)[1])
        data = os.path.join(self.tmp, "data")
        r = subprocess.run([MUSTER, "head", "--server-only", "--listen", "127.0.0.1:%d" % port,
                            "--data-dir", data], capture_output=True, text=True, timeout=60,
                           env=self.env(url=False, token=False))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn("cannot listen on 127.0.0.1:%d: Address already in use" % port, r.stderr)
        self.assertFalse(os.path.exists(data))

    def test_new_store_is_one_log_line(self):
        data = os.path.join(self.tmp, "data")
        log = open(os.path.join(self.tmp, "head.log"), "w+")
        proc = subprocess.Popen([MUSTER, "head", "--server-only", "--listen", "127.0.0.1:0",
                                 "--data-dir", data], stdout=subprocess.PIPE, stderr=log,
                                text=True, env=self.env(url=False, token=False))
        try:
            self.assertIn("listening on", proc.stdout.readline())  # the banner: it runs
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
            log.seek(0)
            lines = log.read().splitlines()
            log.close()
        store = [l for l in lines if "store:" in l]
        self.assertEqual(len(store), 1, lines)
        self.assertRegex(store[0], r"INFO  store: created a new store at schema version \d+$")

    # ---- lease, complete, fail -------------------------------------------------------------------

    def lease(self, q, *opts):
        return [json.loads(line) for line in self.ok("lease", "--queue", q, *opts).splitlines()]

    def test_lease_complete_fail(self):
        q = self.queue("", "--backoff-ms", "0", "--backoff-max-ms", "0")
        ids = [int(x) for x in self.ok("put", "--queue", q, "one", "two", "three", "four").split()]
        leases = self.lease(q, "--max", "3")
        self.assertEqual([l["task"] for l in leases], ids[:3])
        self.assertEqual([l["payload"] for l in leases], ["one", "two", "three"])
        for l in leases:
            self.assertEqual(l["attempt"], 1)
            self.assertGreater(l["token"], 0)
            self.assertIsNone(l["parent"])
        a, b, c = leases
        self.ok("complete", str(a["task"]), str(a["token"]), "the result")
        self.assertEqual(self.api("GET", "/v1/tasks/%d" % a["task"])["result"], "the result")
        # Again under the same token (a retry after a lost reply): a repeat, answered; the
        # first result stays. Any other call under that token: the lease is over.
        # It exits 0 (a success by design), and says on stderr that the result given now
        # was not stored.
        r = self.muster("complete", str(a["task"]), str(a["token"]), "another result")
        self.assertEqual((r.returncode, r.stdout), (0, ""), r.stderr)
        self.assertEqual(r.stderr, "muster: task %d was already completed under token %d: its "
                         "first result is kept, and this one, which differs, was not stored\n"
                         % (a["task"], a["token"]))
        self.assertEqual(self.api("GET", "/v1/tasks/%d" % a["task"])["result"], "the result")
        r = self.muster("complete", str(a["task"]), str(a["token"]), "the result")
        self.assertEqual((r.returncode, r.stderr), (0, "muster: task %d was already completed "
                         "under token %d, with this same result; nothing changed\n"
                         % (a["task"], a["token"])))
        err = self.fails(1, "release", str(a["task"]), str(a["token"]))
        self.assertTrue(err.startswith("muster: lease_lost: "), err)
        r = self.muster("complete", str(b["task"]), str(b["token"]), "--json", '{"n": [1]}')
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))  # a first: quiet
        self.assertEqual(self.api("GET", "/v1/tasks/%d" % b["task"])["result"], {"n": [1]})
        r = self.muster("fail", str(c["task"]), str(c["token"]), "--error", "flaky")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))  # a first: quiet
        task = self.api("GET", "/v1/tasks/%d" % c["task"])
        self.assertEqual((task["state"], task["error"]), ("queued", "flaky"))
        # A fail sent again under its token is a repeat too: exit 0, said on stderr, and
        # the error and --permanent given now are not applied.
        r = self.muster("fail", str(c["task"]), str(c["token"]), "--error", "other", "--permanent")
        self.assertEqual((r.returncode, r.stdout), (0, ""), r.stderr)
        self.assertEqual(r.stderr, "muster: task %d was already failed under token %d: the first "
                         "fail stands (its error, and whether it was permanent), and this one "
                         "changed nothing\n" % (c["task"], c["token"]))
        task = self.api("GET", "/v1/tasks/%d" % c["task"])
        self.assertEqual((task["state"], task["error"]), ("queued", "flaky"))
        again = self.lease(q, "--max", "2")
        self.assertEqual(sorted(l["task"] for l in again), sorted([c["task"], ids[3]]))
        for l in again:
            self.ok("fail", str(l["task"]), str(l["token"]), "--error", "no", "--permanent")
        self.assertEqual(self.counts(q)["failed"], 2)
        self.assertEqual(self.lease(q, "--wait-ms", "50"), [])
        bad = self.fails(1, "complete", str(ids[3]), "123456", "x", "--json")
        self.assertIn("invalid_argument", bad)  # 'x' is not JSON: refused before sending

    def test_json_reals_come_back_as_written(self):
        # A real travels as the shortest text that reads back as the same double, so
        # what a user wrote that way comes back byte for byte, not as "%.17g" writes
        # it (0.1 was 0.10000000000000001, 1e300 was 1.0000000000000001e300).
        q = self.queue()
        payload = ('{"x":0.1,"y":1e300,"z":[0.3,2.5e-7,-0.0,1.0,5e-324,0.30000000000000004,'
                   '1.7976931348623157e308,0.3333333333333333],"n":7}')
        result = '{"score":0.1,"v":[2.5e-7,1e300,100.0]}'
        (task,) = self.ok("put", "--queue", q, "--json", payload).split()
        stored = self.head.request("GET", "/v1/tasks/" + task).raw.decode()
        self.assertIn('"payload":%s,' % payload, stored)
        (line,) = self.ok("lease", "--queue", q).splitlines()
        self.assertIn('"payload":%s,' % payload, line)
        lease = json.loads(line)
        # `tasks show` indents; without its whitespace (no string here holds any) the
        # payload is the text sent.
        shown = "".join(self.ok("tasks", "show", task).split())
        self.assertIn('"payload":%s,' % payload, shown)
        (listed,) = self.ok("tasks", "ls", "--queue", q, "--json").splitlines()
        self.assertIn('"payload":%s,' % payload, listed)
        # The table's DETAIL, cut at its width.
        self.assertIn(payload[:50], self.ok("tasks", "ls", "--queue", q))
        self.ok("complete", str(lease["task"]), str(lease["token"]), "--json",
                '{"score": 0.1, "v": [2.5e-7, 1E300, 100.0]}')  # spaced, 1E300: rewritten
        stored = self.head.request("GET", "/v1/tasks/" + task).raw.decode()
        self.assertIn('"result":%s,' % result, stored)
        shown = "".join(self.ok("tasks", "show", task).split())
        self.assertIn('"result":%s,' % result, shown)
        (listed,) = self.ok("tasks", "ls", "--queue", q, "--json").splitlines()
        self.assertIn('"result":%s,' % result, listed)
        self.assertIn(result, self.ok("tasks", "ls", "--queue", q))
        self.assertEqual(json.loads(listed)["result"], {"score": 0.1, "v": [2.5e-7, 1e300, 100.0]})

    def test_one_task_errors_name_no_batch_element(self):
        # The CLI acknowledges one task per command: the API's "leases[0]" (the
        # element of the request body it built) names nothing the user typed.
        missing = "999999999"
        for args in (["complete", missing, "1"], ["fail", missing, "1"],
                     ["extend", missing, "1"], ["release", missing, "1"],
                     ["flag", missing, "1"]):
            with self.subTest(args=args):
                err = self.fails(1, *args)
                self.assertEqual(err, "muster: task_not_found: task %s does not exist\n"
                                 % missing)

    def test_extend_release_flag(self):
        q = self.queue()
        self.ok("put", "--queue", q, "x")
        (l,) = self.lease(q)
        task, token = str(l["task"]), str(l["token"])
        self.ok("extend", task, token, "--lease-ms", "120000")
        deadline = self.api("GET", "/v1/tasks/" + task)["lease"]["deadline_ms"]
        self.assertGreater(deadline, l["deadline_ms"])
        r = self.muster("release", task, token)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))  # a first: quiet
        self.assertEqual(self.api("GET", "/v1/tasks/" + task)["state"], "queued")
        # Sent again under its token (a retry after a lost reply), each is a repeat the
        # head answers: exit 0, and stderr says that nothing changed.
        r = self.muster("release", task, token)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", "muster: task %s was "
                         "already released under token %s; nothing changed\n" % (task, token)))
        (l,) = self.lease(q)
        flag = [str(l["task"]), str(l["token"])]
        r = self.muster("flag", *flag, "--reason", "corrupt")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))
        self.assertEqual(self.api("GET", "/v1/tasks/" + task)["flags"], 1)
        r = self.muster("flag", *flag, "--reason", "another")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", "muster: task %s was "
                         "already flagged under token %s: the first flag counts, with its "
                         "reason, and this one changed nothing\n" % tuple(flag)))
        self.assertEqual(self.api("GET", "/v1/tasks/" + task)["flags"], 1)
        # The lease the release ended is not the task's last to end now: no repeat.
        self.assertIn("lease_lost", self.fails(1, "release", task, token))

    # ---- tasks ----------------------------------------------------------------------------------------

    def test_tasks_commands(self):
        q = self.queue("", "--max-attempts", "1", "--backoff-ms", "0")
        ids = self.ok("put", "--queue", q, "a", "b", "c", "d").split()
        leases = self.lease(q, "--max", "3")
        self.ok("fail", str(leases[0]["task"]), str(leases[0]["token"]), "--error", "gone")
        self.ok("fail", str(leases[1]["task"]), str(leases[1]["token"]), "--permanent",
                "--error", "broken\nbadly")
        self.ok("complete", str(leases[2]["task"]), str(leases[2]["token"]), "RESULT-C")
        table = self.ok("tasks", "ls", "--queue", q).splitlines()
        self.assertEqual(table[0].split(), ["ID", "STATE", "PRI", "ATTEMPTS", "FLAGS",
                                            "DETAIL"])
        self.assertEqual([r.split()[:2] for r in table[1:]],
                         [[ids[0], "dead"], [ids[1], "failed"], [ids[2], "done"],
                          [ids[3], "queued"]])
        self.assertIn("broken badly", table[2])
        self.assertIn("RESULT-C", table[3])  # a done task shows its result, not its payload
        lines = self.ok("tasks", "ls", "--queue", q, "--json", "--limit", "2").splitlines()
        self.assertEqual([json.loads(x)["id"] for x in lines], [int(ids[0]), int(ids[1])])
        lines = self.ok("tasks", "ls", "--queue", q, "--json", "--state", "queued").splitlines()
        self.assertEqual([json.loads(x)["payload"] for x in lines], ["d"])
        lines = self.ok("tasks", "ls", "--queue", q, "--json", "--after", ids[2]).splitlines()
        self.assertEqual(len(lines), 1)
        self.assertIn("--state: expected queued, leased",
                      self.fails(2, "tasks", "ls", "--queue", q, "--state", "bogus"))
        shown = json.loads(self.ok("tasks", "show", ids[1]))
        self.assertEqual((shown["id"], shown["state"], shown["error"]),
                         (int(ids[1]), "failed", "broken\nbadly"))
        self.assertIn("task_not_found", self.fails(1, "tasks", "show", "99999999"))
        self.assertIn("expected an integer", self.fails(2, "tasks", "show", "abc"))
        dead = [json.loads(x) for x in
                self.ok("tasks", "dead", "--queue", q, "--json").splitlines()]
        self.assertEqual([(t["id"], t["state"]) for t in dead],
                         [(int(ids[0]), "dead"), (int(ids[1]), "failed")])
        table = self.ok("tasks", "dead", "--queue", q)
        self.assertIn("gone", table)
        self.assertEqual(self.ok("tasks", "requeue", ids[0]).strip(), "requeued task " + ids[0])
        self.assertIn("invalid_state", self.fails(1, "tasks", "requeue", ids[0]))
        self.assertEqual(self.ok("tasks", "requeue", "--queue", q).strip(),
                         "requeued 1 task of " + q)
        self.assertEqual(self.ok("tasks", "dead", "--queue", q, "--json"), "")
        self.assertEqual(self.counts(q)["queued"], 3)
        self.assertEqual(self.ok("queue", "requeue", q).strip(), "requeued 0 tasks of " + q)

    # ---- the worker runner ----------------------------------------------------------------------------

    def test_worker_three_stage_pipeline(self):
        s3 = self.queue("-3")
        s2 = self.queue("-2", "--next", s3)
        s1 = self.queue("-1", "--next", s2)
        words = ["hello", "muster", "a b c", "x"]
        self.ok("put", "--queue", s1, *words)
        w1 = self.worker(s1, "tr", "a-z", "A-Z", opts=["--max-tasks", "4"])
        w2 = self.worker(s2, "rev", opts=["--max-tasks", "4", "--nickname", "rev"])
        w3 = self.worker(s3, "sed", "-e", "s/^/<</", "-e", "s/$/>>/", opts=["--max-tasks", "4"])
        for w in (w1, w2, w3):
            err = self.finish(w)
            self.assertIn("4 completed, 0 failed", err)
        done = self.tasks(s3, "done")
        self.assertEqual(sorted(t["result"] for t in done),
                         sorted(["<<OLLEH>>", "<<RETSUM>>", "<<C B A>>", "<<X>>"]))
        for t in done:
            self.assertIsNotNone(t["parent"])
        self.assertEqual(self.counts(s1)["done"], 4)
        self.assertEqual(self.counts(s2)["done"], 4)
        board = self.api("GET", "/v1/leaderboard")["leaderboard"]
        self.assertIn("rev", [row["nickname"] for row in board])

    def test_worker_failing_command(self):
        q = self.queue("", "--max-attempts", "1")
        ids = self.ok("put", "--queue", q, "short", "long", "quiet").split()
        script = ('read x; if [ "$x" = short ]; then echo first >&2; echo "it broke" >&2; exit 3; '
                  'elif [ "$x" = long ]; then head -c 5000 /dev/zero | tr "\\0" x >&2; '
                  'echo END >&2; exit 1; else kill -9 $$; fi')
        err = self.finish(self.worker(q, "sh", "-c", script, opts=["--max-tasks", "3"]))
        self.assertIn("0 completed, 3 failed", err)
        short, long_, quiet = (self.api("GET", "/v1/tasks/" + i) for i in ids)
        self.assertEqual((short["state"], short["error"]), ("dead", "first\nit broke"))
        self.assertTrue(long_["error"].endswith("xxxxEND"), long_["error"][-20:])
        self.assertLessEqual(len(long_["error"]), 2048)
        self.assertGreaterEqual(len(long_["error"]), 2000)
        self.assertEqual(quiet["error"], "killed by signal 9")
        # Each failure is said in one line: a multi-line error by its last line, which
        # says the most (a traceback's exception), and where the rest is; a one-line
        # error as it is.
        dead = "; it is dead after 1 attempt: 'muster tasks dead --queue %s' lists it\n" % q
        self.assertIn("muster worker: task %s failed (exit status 3): it broke (the last line of "
                      "its error; 'muster tasks show %s' has all of it)%s" % (ids[0], ids[0], dead),
                      err)
        self.assertIn("muster worker: task %s failed: killed by signal 9%s" % (ids[2], dead), err)
        self.assertNotIn("failed: first", err)

    def test_worker_refuses_missing_command(self):
        q = self.queue("", "--max-attempts", "3", "--backoff-ms", "10", "--backoff-max-ms", "20")
        ids = self.ok("put", "--queue", q, "a", "b", "c").split()
        script = os.path.join(self.tmp, "not-executable")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat\n")
        for cmd, why in (("/usr/bin/nonexistent-tool", "No such file or directory"),
                         ("nonexistent-tool-0417", "no executable of that name in PATH"),
                         (script, "no execute permission"), (self.tmp, "not a regular file")):
            for opts in ([], ["--max-tasks", "1"]):
                r = subprocess.run([MUSTER, "worker", "--queue", q] + opts + ["--", cmd],
                                   env=self.env(), capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 2, (cmd, r.stderr))
                self.assertIn("cannot run '%s': %s" % (cmd, why), r.stderr)
                self.assertIn("nothing was leased", r.stderr)
        for task in (self.api("GET", "/v1/tasks/" + i) for i in ids):
            self.assertEqual((task["state"], task["attempts"]), ("queued", 0), task)
        workers = self.api("GET", "/v1/workers")["workers"]
        self.assertEqual([w for w in workers if q in (w.get("queues") or [])], [])

    def test_worker_command_gone_at_run_time_releases_task(self):
        q = self.queue("", "--max-attempts", "3", "--backoff-ms", "10", "--backoff-max-ms", "20")
        script = os.path.join(self.tmp, "tool")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat\n")
        os.chmod(script, 0o755)
        proc = self.worker(q, script, opts=["--concurrency", "2"])
        harness.wait_until(lambda: "on queue " + q in self.log_of(proc), timeout=30,
                           what="the worker to join")
        os.unlink(script)  # checked at start; gone before the first task
        ids = self.ok("put", "--queue", q, "a", "b", "c").split()
        proc.wait(timeout=60)
        err = self.log_of(proc)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("cannot run '%s'" % script, err)
        self.assertIn("released, stopping the worker", err)
        for task in (self.api("GET", "/v1/tasks/" + i) for i in ids):
            self.assertEqual((task["state"], task["attempts"]), ("queued", 0), task)

    def test_worker_payload_and_json_result(self):
        q = self.queue()
        ids = self.ok("put", "--queue", q, "--json", '{"a": [1, 2]}', '"line one\\nline two"',
                      "17").split()
        self.finish(self.worker(q, "cat", opts=["--max-tasks", "3", "--json-result"]))
        results = [self.api("GET", "/v1/tasks/" + i)["result"] for i in ids[:1] + ids[2:]]
        self.assertEqual(results, [{"a": [1, 2]}, 17])
        # A string payload reaches the command as its raw text: not JSON, so it fails here.
        bad = self.api("GET", "/v1/tasks/" + ids[1])
        self.assertIn("stdout is not valid JSON", bad["error"])
        q2 = self.queue("-env")
        (task,) = self.ok("put", "--queue", q2, "x").split()
        self.finish(self.worker(q2, "sh", "-c", 'echo "$MUSTER_TASK_ID $MUSTER_ATTEMPT $MUSTER_QUEUE"',
                                opts=["--max-tasks", "1"]))
        self.assertEqual(self.api("GET", "/v1/tasks/" + task)["result"], "%s 1 %s" % (task, q2))

    def started(self, n):
        return len([f for f in os.listdir(self.tmp) if f.startswith("started-")]) >= n

    def worker_progress(self, name_part=None):
        workers = self.api("GET", "/v1/workers")["workers"]
        return [w["progress"] for w in workers if w["state"] == "active"]

    def test_worker_concurrency_and_progress(self):
        q = self.queue()
        ids = self.ok("put", "--queue", q, "p", "q", "r").split()
        w = self.worker(q, "sh", "-c", BLOCKING, "sh", self.tmp,
                        opts=["--concurrency", "2", "--max-tasks", "3", "--nickname", "conc"])
        # Two tasks run at once; the heartbeat reports both.
        harness.wait_until(lambda: self.started(2), timeout=20, what="two tasks started")
        want = "running tasks %s, %s" % (ids[0], ids[1])
        alt = "running tasks %s, %s" % (ids[1], ids[0])
        harness.wait_until(lambda: set(self.worker_progress()) & {want, alt}, timeout=20,
                           what="progress of both tasks")
        self.assertEqual(self.counts(q)["leased"], 2)
        open(os.path.join(self.tmp, "go"), "w").close()
        self.assertIn("3 completed", self.finish(w))
        self.assertEqual([self.api("GET", "/v1/tasks/" + i)["result"] for i in ids],
                         ["p", "q", "r"])
        workers = self.api("GET", "/v1/workers")["workers"]
        mine = [x for x in workers if x["nickname"] == "conc"]
        self.assertEqual([(x["state"], x["completed"]) for x in mine], [("gone", 3)])

    def test_worker_extends_lease(self):
        q = self.queue("", "--lease-ms", "400")
        (task,) = self.ok("put", "--queue", q, "slow").split()
        w = self.worker(q, "sh", "-c", BLOCKING, "sh", self.tmp, opts=["--max-tasks", "1"])
        harness.wait_until(lambda: self.started(1), timeout=20, what="the task started")
        first = self.api("GET", "/v1/tasks/" + task)["lease"]["deadline_ms"]
        seen = set()

        def extended_three_times():
            lease = self.api("GET", "/v1/tasks/" + task)["lease"]
            if lease:
                seen.add(lease["deadline_ms"])
            return len([d for d in seen if d > first]) >= 3

        harness.wait_until(extended_three_times, timeout=20, what="the lease to be extended")
        open(os.path.join(self.tmp, "go"), "w").close()
        self.finish(w)
        done = self.api("GET", "/v1/tasks/" + task)
        self.assertEqual((done["state"], done["attempts"], done["result"]), ("done", 1, "slow"))

    def test_worker_sigterm_finishes_running_task(self):
        q = self.queue()
        ids = self.ok("put", "--queue", q, "first", "second").split()
        w = self.worker(q, "sh", "-c", BLOCKING, "sh", self.tmp)
        harness.wait_until(lambda: self.started(1), timeout=20, what="the task started")
        w.send_signal(signal.SIGTERM)
        harness.wait_until(lambda: "finishing running tasks" in self.log_of(w), timeout=20,
                           what="the worker to acknowledge SIGTERM")
        self.assertIsNone(w.poll())
        self.assertEqual(self.api("GET", "/v1/tasks/" + ids[0])["state"], "leased")
        open(os.path.join(self.tmp, "go"), "w").close()
        self.assertIn("0 failed", self.finish(w))
        self.assertEqual(self.api("GET", "/v1/tasks/" + ids[0])["result"], "first")
        self.assertEqual(self.api("GET", "/v1/tasks/" + ids[1])["state"], "queued")

    def workers_named(self, nickname, state="active"):
        return [w for w in self.api("GET", "/v1/workers")["workers"]
                if w["nickname"] == nickname and w["state"] == state]

    def test_worker_idle_sigint_says_bye(self):
        q = self.queue()
        w = self.worker(q, "cat", opts=["--nickname", "idle-one"])
        (mine,) = harness.wait_until(lambda: self.workers_named("idle-one"), timeout=20,
                                     what="the worker to register")
        w.send_signal(signal.SIGINT)
        self.assertIn("0 completed, 0 failed", self.finish(w))
        gone = self.api("GET", "/v1/workers/%d" % mine["id"])
        self.assertEqual(gone["state"], "gone")

    def test_worker_second_signal_releases_running_task(self):
        q = self.queue()
        (task,) = self.ok("put", "--queue", q, "stuck").split()
        w = self.worker(q, "sh", "-c", BLOCKING, "sh", self.tmp)
        harness.wait_until(lambda: self.started(1), timeout=20, what="the task started")
        w.send_signal(signal.SIGTERM)
        harness.wait_until(lambda: "finishing running tasks" in self.log_of(w), timeout=20,
                           what="the first signal")
        w.send_signal(signal.SIGTERM)
        self.finish(w)
        released = self.api("GET", "/v1/tasks/" + task)
        self.assertEqual((released["state"], released["error"]), ("queued", None))

    def test_worker_kill_9_kills_its_command(self):
        """kill -9 of a standalone worker: its command and the command's child die at
        once (the guard's PR_SET_PDEATHSIG, no agent involved), and the lease expires
        as before, so another worker runs the task."""
        q = self.queue("", "--lease-ms", "1000")
        (task,) = self.ok("put", "--queue", q, "again").split()
        w = self.worker(q, "sh", "-c", ORPHAN_CANDIDATE, "sh", self.tmp)
        pids_file = os.path.join(self.tmp, "pids")
        harness.wait_until(lambda: os.path.exists(pids_file), timeout=20,
                           what=lambda: "the command to start:\n" + self.log_of(w))
        with open(pids_file) as f:
            pids = [int(p) for p in f.read().split()]
        self.assertEqual(len(pids), 2)
        self.assertTrue(all(node_harness.alive(p) for p in pids))
        w.kill()
        w.wait()
        # Without the guard both stay alive (reparented to init) until sleep 600 ends.
        harness.wait_until(lambda: not any(node_harness.alive(p) for p in pids), timeout=10,
                           what="the dead worker's command gone: %r" % [
                               p for p in pids if node_harness.alive(p)])
        # Nothing was lost: the lease expires (the worker said no goodbye), the attempt
        # counts, and the next worker completes the task.
        harness.wait_until(lambda: self.api("GET", "/v1/tasks/" + task)["state"] == "queued",
                           timeout=20, what="the lease to expire")
        w2 = self.worker(q, "sh", "-c", ORPHAN_CANDIDATE, "sh", self.tmp,
                         opts=["--max-tasks", "1"])
        self.finish(w2)
        done = self.api("GET", "/v1/tasks/" + task)
        self.assertEqual((done["state"], done["attempts"], done["result"]), ("done", 2, "again"))

    def test_worker_registers_again_when_forgotten(self):
        q = self.queue()
        w = self.worker(q, "cat", opts=["--nickname", "forgotten", "--max-tasks", "1"])
        (first,) = harness.wait_until(lambda: self.workers_named("forgotten"), timeout=20,
                                      what="the worker to register")
        self.api("DELETE", "/v1/workers/%d" % first["id"])
        harness.wait_until(lambda: self.workers_named("forgotten"), timeout=20,
                           what="the worker to register again")
        (task,) = self.ok("put", "--queue", q, "still working").split()
        self.assertIn("registered again", self.finish(w))
        self.assertEqual(self.api("GET", "/v1/tasks/" + task)["result"], "still working")


if __name__ == "__main__":
    unittest.main(verbosity=2)
