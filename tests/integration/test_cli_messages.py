"""What the `muster` command line says when something goes wrong: each message in the
CLI's words (options as typed, paths as looked at), with the advice that fits the case.

The tests share one head (a short --sweep-ms, for shared data that expires); each uses
its own names.  Nothing waits on a timer: tests poll observable state.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402

MUSTER = harness.MUSTER_BIN


class CutProxy:
    """A TCP proxy to a head that plays the head dying mid-request: the `cut_at`-th POST
    it forwards reaches the head, whose reply it drops; it then closes the client's
    connection and refuses new ones, as a dead head's port does."""

    def __init__(self, port, cut_at):
        self.port, self.cut_at, self.posts = port, cut_at, 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            head = socket.create_connection(("127.0.0.1", self.port))
            cut = threading.Event()
            threading.Thread(target=self._to_head, args=(client, head, cut), daemon=True).start()
            threading.Thread(target=self._to_client, args=(client, head, cut),
                             daemon=True).start()

    def _to_head(self, client, head, cut):
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                return
            if not data:
                return
            posts = data.count(b"POST /v1/")
            self.posts += posts
            if posts and self.posts >= self.cut_at:
                cut.set()  # a client sends its next request only after the last reply
            head.sendall(data)

    def _to_client(self, client, head, cut):
        while True:
            data = head.recv(65536)
            if not data:
                return
            if cut.is_set():  # the reply to the cut request: the head has done it
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept; connects refused
                self.listener.close()
                client.shutdown(socket.SHUT_RDWR)
                client.close()
                head.close()
                return
            client.sendall(data)


class OneReply:
    """A server that answers one request, `GET /v1/health` as a head or agent would
    (its Server header `server`), and then refuses connections, as one that stopped."""

    def __init__(self, server):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        body = b'{"status":"ok"}'
        self.reply = (b"HTTP/1.1 200 OK\r\nServer: %s\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                      % (server.encode(), len(body), body))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.listener.accept()
        self.listener.close()  # refused from now on
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        conn.sendall(self.reply)
        conn.close()


class CliMessagesTest(harness.CliHead, unittest.TestCase):
    HEAD_ARGS = ("--sweep-ms", "50")

    def env(self, url=True, token=True):
        return harness.cli_env(self.head, url, token)

    # ---- url and token -------------------------------------------------------------

    def test_no_token_says_where_it_looked(self):
        nope = os.path.join(self.cwd, "nope")
        err = self.fails(1, "queue", "ls", "--data-dir", nope, token=False)
        self.assertEqual(err, "muster: unauthorized: the head needs a token, and no token was "
                         "given: not by --token, not by MUSTER_TOKEN, and not in %s/token (No such "
                         "file or directory, from --data-dir)\n"
                         "muster: pass --token, set MUSTER_TOKEN, or point --data-dir (or "
                         "MUSTER_DATA_DIR) at the head's data dir, which holds the file "
                         "'token'\n" % nope)
        self.assertNotIn("Authorization", err)
        # Without --data-dir it looked in ./muster-data; an empty token file is named so.
        err = self.fails(1, "queue", "ls", token=False)
        self.assertIn("not in ./muster-data/token (No such file or directory, from the default "
                      "data dir)", err)
        os.mkdir(nope)
        open(os.path.join(nope, "token"), "w").close()
        env = dict(self.env(token=False), MUSTER_DATA_DIR=nope)
        r = subprocess.run([MUSTER, "queue", "ls"], capture_output=True, text=True, env=env,
                           cwd=self.cwd, timeout=60)
        self.assertIn("not in %s/token (it is empty, from MUSTER_DATA_DIR)" % nope, r.stderr)

    def test_data_dir_without_url_file_is_refused(self):
        # A named data dir is where the URL comes from: one without a url file is said so
        # (exit 2), not replaced by the default URL, which may be another head's.
        nope = os.path.join(self.cwd, "no-such-dir")
        err = self.fails(2, "queue", "ls", "--data-dir", nope, url=False, token=False)
        self.assertEqual(err, "muster: --data-dir '%s' has no url file (%s/url: No such file or "
                         "directory), which a head writes while it runs: start the head with "
                         "this data dir, name the data dir of a running head, or pass --url "
                         "(or set MUSTER_URL)\nTry 'muster queue ls --help' for more "
                         "information.\n" % (nope, nope))
        stopped = os.path.join(self.cwd, "stopped-head")  # a data dir whose head is gone
        os.makedirs(stopped, exist_ok=True)
        env = dict(self.env(url=False), MUSTER_DATA_DIR=stopped)
        r = subprocess.run([MUSTER, "status"], capture_output=True, text=True, env=env,
                           cwd=self.cwd, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("muster: MUSTER_DATA_DIR '%s' has no url file (%s/url: No such file or "
                      "directory)" % (stopped, stopped), r.stderr)
        self.assertEqual(r.stdout, "")
        # The URL given otherwise needs no url file: the data dir serves for the token.
        with open(os.path.join(stopped, "token"), "w") as f:
            f.write(self.head.token + "\n")
        self.assertIn("NAME", self.ok("queue", "ls", "--data-dir", stopped, token=False))
        # With the head's own data dir, its url file names it.
        self.assertIn("NAME", self.ok("queue", "ls", "--data-dir", self.head.data_dir,
                                      url=False, token=False))

    def test_client_options_before_the_command(self):
        out = self.ok("--token", self.head.token, "--url=" + self.head.url, "queue", "ls",
                      url=False, token=False)
        self.assertIn("NAME", out)
        self.ok("--url", self.head.url, "queue", "create", "msg-before", "--lease-ms", "5000",
                url=False)
        self.assertIn("msg-before", self.ok("--url", self.head.url, "status", url=False))
        err = self.fails(2, "--token", self.head.token)
        self.assertIn("muster: the options are not followed by a command", err)

    def test_results_of_an_unknown_session_print_no_cursor(self):
        err = self.fails(1, "session", "results", "s-0123456789abcdef")
        self.assertNotIn("cursor:", err)
        self.assertIn("session_not_found", err)
        # A session that exists still gives the cursor to resume from.
        self.ok("queue", "create", "msg-cursor")
        sid = self.ok("session", "create", "--queue", "msg-cursor").strip()
        self.assertEqual(self.muster("session", "results", sid).stderr, "cursor: 0\n")

    def test_a_gap_in_the_results_names_the_options_that_read_on(self):
        # The library's advice was "read with order=completion", a query string of the
        # HTTP API; the command line's words are --order completion, and --cursor.
        self.ok("queue", "create", "msg-gap")
        sid = self.ok("session", "create", "--queue", "msg-gap").strip()
        tasks = [{"payload": "a", "index": 0}, {"payload": "b", "index": 3}]
        r = self.head.request("POST", "/v1/sessions/%s/tasks" % sid, {"tasks": tasks})
        self.assertEqual(r.status, 201, r)
        leased = self.ok("lease", "--queue", "msg-gap", "--max", "2").splitlines()
        self.assertEqual(len(leased), 2, leased)
        for lease in map(json.loads, leased):
            self.ok("complete", str(lease["task"]), str(lease["token"]), "done")
        err = self.fails(1, "session", "results", sid, "--cursor", "1")
        self.assertEqual(err, "cursor: 1\n"
                         "muster: index_gap: session %s: index 1 has no task (indexes 1-2 were "
                         "never submitted, or purged) and every task submitted (2) has its "
                         "result, so the results in submission order cannot go past it; submit "
                         "tasks at indexes 1-2, or read on past it (from cursor 3) or in "
                         "completion order\n"
                         "muster: to read on, pass --cursor 3 (past the gap) or --order "
                         "completion\n" % sid)
        self.assertNotIn("order=", err)
        self.assertEqual(len(self.ok("session", "results", sid, "--cursor", "3").splitlines()), 1)
        self.assertEqual(len(self.ok("session", "results", sid, "--order", "completion")
                             .splitlines()), 2)

    def test_ack_commands_say_which_argument_is_wrong(self):
        for cmd in ("complete", "fail", "extend", "release", "flag"):
            err = self.fails(2, cmd, "abc")
            self.assertTrue(err.startswith("muster: TASK: expected an integer, got 'abc'\n"),
                            err)
        err = self.fails(2, "complete", "5")
        self.assertTrue(err.startswith("muster: 'complete' needs TASK TOKEN [RESULT]: TOKEN (the "
                                       "lease's token) is missing\n"), err)
        err = self.fails(2, "complete")
        self.assertTrue(err.startswith("muster: 'complete' needs TASK TOKEN [RESULT]: TASK and "
                                       "TOKEN are missing\n"), err)
        # The lease's token given as --token, which is the head's bearer token: it said
        # only that TOKEN was missing, beside the token the user had just typed.
        err = self.fails(2, "complete", "5", "--token", "1838606449445908")
        self.assertTrue(err.startswith("muster: 'complete' needs TASK TOKEN [RESULT]: TOKEN (the "
                                       "lease's token) is missing (--token is the head's bearer "
                                       "token, not the lease's: give the lease's after TASK)\n"),
                        err)

    def test_numbers_beyond_the_heads_limits_are_usage_errors(self):
        # The head refused them, naming its JSON field ("tasks[0].priority") and exit 1,
        # as if the request had failed; they are command-line mistakes.
        self.ok("queue", "create", "msg-range")
        for args, says in ((("put", "--queue", "msg-range", "--priority", "2147483648", "x"),
                            "--priority: must be at most 2147483647, got 2147483648"),
                           (("put", "--queue", "msg-range", "--priority", "-2147483649", "x"),
                            "--priority: must be at least -2147483648, got -2147483649"),
                           (("lease", "--queue", "msg-range", "--max", "1001"),
                            "--max: must be at most 1000, got 1001")):
            err = self.fails(2, *args)
            self.assertTrue(err.startswith("muster: %s\n" % says), err)
        self.assertEqual(self.ok("tasks", "ls", "--queue", "msg-range", "--json"), "")
        self.ok("put", "--queue", "msg-range", "--priority", "-2147483648", "x")
        self.assertIn('"priority":-2147483648', self.ok("tasks", "ls", "--queue", "msg-range",
                                                         "--json"))

    def test_integers_too_large_for_64_bits_are_out_of_range(self):
        # strtoll's ERANGE was told as "expected an integer", though the word is one.
        big, int64_max = "99999999999999999999", "9223372036854775807"
        for args, says in ((("queue", "create", "msg-big", "--max-attempts", big),
                            "--max-attempts: %s is out of range: it must be from 1 to %s"
                            % (big, int64_max)),
                           (("put", "--queue", "msg-big", "--priority", "-" + big, "x"),
                            "--priority: -%s is out of range: it must be from -2147483648 to "
                            "2147483647" % big),
                           (("lease", "--queue", "msg-big", "--max", big),
                            "--max: %s is out of range: it must be from 1 to 1000" % big),
                           (("tasks", "show", big),
                            "ID: %s is out of range: it must be from 1 to %s" % (big, int64_max)),
                           (("complete", "1", big),
                            "TOKEN: %s is out of range: it must be from 1 to %s"
                            % (big, int64_max))):
            err = self.fails(2, *args)
            self.assertTrue(err.startswith("muster: %s\n" % says), err)
        self.assertIn("expected an integer, got '12x'",
                      self.fails(2, "queue", "create", "msg-big", "--max-attempts", "12x"))

    def test_an_option_value_is_never_the_double_dash(self):
        # `--gpus -- cat` took "--" for the list ("'--' is not a list") and cat for an
        # argument: the option lacks its value, as at the end of the line.
        for args, says in ((("node", "--queue", "q", "--gpus", "--", "cat"),
                            "option '--gpus' needs a value (LIST)"),
                           (("worker", "--queue", "--", "cat"),
                            "option '--queue' needs a value (Q)"),
                           (("put", "--queue", "msg-dash", "--key", "--", "x"),
                            "option '--key' needs a value (K)"),
                           (("queue", "ls", "--url", "--"), "option '--url' needs a value (URL)")):
            err = self.fails(2, *args)
            self.assertTrue(err.startswith("muster: %s\n" % says), err)
        # Given with '=', "--" is the value itself.
        self.ok("queue", "create", "msg-dash")
        self.ok("put", "--queue", "msg-dash", "--key=--", "x")
        self.assertIn('"key":"--"', self.ok("tasks", "ls", "--queue", "msg-dash", "--json"))

    def test_an_option_given_twice_with_two_values_is_said(self):
        # `--queue a --queue b` put everything into b without a word.  The last value
        # still wins (wrappers add theirs to defaults), and the user is told.
        self.ok("queue", "create", "msg-twice-a")
        self.ok("queue", "create", "msg-twice-b")
        r = self.muster("put", "--queue", "msg-twice-a", "--queue=msg-twice-b", "x")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "muster: option '--queue' was given twice, 'msg-twice-a' "
                                   "and then 'msg-twice-b': using 'msg-twice-b' (it takes one "
                                   "value)\n")
        self.assertEqual(self.ok("tasks", "ls", "--queue", "msg-twice-a", "--json").strip(), "")
        self.assertIn('"payload":"x"', self.ok("tasks", "ls", "--queue", "msg-twice-b", "--json"))
        # The same value twice is no contradiction: nothing said.
        r = self.muster("put", "--queue", "msg-twice-a", "--queue", "msg-twice-a", "y")
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        # A token's values are not written out (stderr goes to logs).
        r = self.muster("queue", "ls", "--token", "wrong-secret", "--token", self.head.token,
                        token=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "muster: option '--token' was given twice, with two "
                                   "different values: using the last (it takes one value)\n")

    def test_a_word_with_one_dash_says_where_dashed_arguments_go(self):
        # "unknown option '-x' for 'put'" left a user with a payload "-x" guessing.
        err = self.fails(2, "put", "--queue", "msg-one-dash", "-x")
        self.assertTrue(err.startswith("muster: unknown option '-x' for 'put' (options start "
                                       "with --); an argument that starts with a dash goes "
                                       "after --, which ends the options\n"), err)
        self.ok("queue", "create", "msg-one-dash")
        self.ok("put", "--queue", "msg-one-dash", "--", "-x")
        self.assertIn('"payload":"-x"', self.ok("tasks", "ls", "--queue", "msg-one-dash",
                                                 "--json"))
        # A command that takes no arguments is not told to give one.
        err = self.fails(2, "status", "-v")
        self.assertTrue(err.startswith("muster: unknown option '-v' for 'status' (options start "
                                       "with --)\n"), err)

    def test_a_mistyped_command_or_option_says_what_was_meant(self):
        # A slip of the fingers, an abbreviation or another tool's word for a subcommand
        # is told with the name it likely meant; a word near no name gets no guess.
        for args, line in (
                (["queues", "ls"], "unknown command 'queues' (did you mean 'queue'?)"),
                (["task", "ls"], "unknown command 'task' (did you mean 'tasks'?)"),
                (["statuss"], "unknown command 'statuss' (did you mean 'status'?)"),
                (["ses", "ls"], "unknown command 'ses' (did you mean 'session'?)"),
                (["queue", "list"], "unknown subcommand 'queue list' (did you mean "
                                    "'queue ls'?)"),
                (["queue", "delete", "q"], "unknown subcommand 'queue delete' (did you mean "
                                           "'queue rm'?)"),
                (["queue", "purg", "q"], "unknown subcommand 'queue purg' (did you mean "
                                         "'queue purge'?)"),
                (["help", "queue", "lst"], "unknown subcommand 'queue lst' (did you mean "
                                           "'queue ls'?)"),
                (["queue", "create", "q", "--nxt", "r"], "unknown option '--nxt' for 'queue "
                                                         "create' (did you mean '--next'?)"),
                (["put", "--queue", "q", "--prio", "3", "x"], "unknown option '--prio' for "
                                                              "'put' (did you mean "
                                                              "'--priority'?)"),
                (["nodes", "--al"], "unknown option '--al' for 'nodes' (did you mean "
                                    "'--all'?)"),
                (["status", "--tokn", "x"], "unknown option '--tokn' for 'status' (did you "
                                            "mean '--token'?)"),
                (["foo"], "unknown command 'foo'"),
                (["worke", "--queue", "q"], "unknown command 'worke' (did you mean "
                                            "'worker'?)"),  # the closer of the two
                (["wor", "--queue", "q"], "unknown command 'wor'"),  # worker or workers?
                (["iter", "create", "t", "--num", "5"], "unknown option '--num' for 'iter "
                                                        "create'")):
            with self.subTest(args=args):
                err = self.fails(2, *args)
                self.assertEqual(err.splitlines()[0], "muster: " + line)

    def test_tasks_ls_unknown_state_is_a_usage_error(self):
        # It went to the head, which refused it: exit 1, as if the request had failed.
        err = self.fails(2, "tasks", "ls", "--queue", "msg-state", "--state", "bogus")
        self.assertTrue(err.startswith("muster: --state: expected queued, leased, done, failed, "
                                       "dead or cancelled, got 'bogus'\n"), err)

    # ---- input ---------------------------------------------------------------------

    def test_put_of_nothing_says_nothing_was_put(self):
        # An empty stdin put nothing and exited 0 without a word, into a queue that does
        # not even exist: it read as work submitted.
        self.ok("queue", "create", "msg-none")
        for args, stdin, source in ((("--queue", "msg-none"), "", "standard input"),
                                    (("--queue", "msg-none"), "\n\r\n\n", "standard input"),
                                    (("--queue", "msg-none", "--json", "--file", "-"), "[]",
                                     "standard input"),
                                    (("--queue", "msg-none", "--file", os.devnull), "",
                                     "'%s'" % os.devnull)):
            r = self.muster("put", *args, stdin=stdin)
            self.assertEqual((r.returncode, r.stdout), (1, ""), (args, r.stderr))
            self.assertEqual(r.stderr, "muster: invalid_argument: no payloads were read from %s; "
                             "nothing was put into queue '%s'\n" % (source, args[1]))
        sid = self.ok("session", "create", "--queue", "msg-none").strip()
        r = self.muster("session", "put", sid, stdin="\n")
        self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
        self.assertEqual(r.stderr, "muster: invalid_argument: no inputs were read from "
                         "standard input; nothing was put into session %s\n" % sid)
        # Into a queue or session that does not exist, nothing read still said only that:
        # the missing queue or session is said first, as a put of payloads says it.
        for args, says, what in (
                (("put", "--queue", "nope"), "queue_not_found: queue 'nope' does not exist\n"
                 "muster: create it with `muster queue create nope` (or see `muster queue ls` "
                 "for the queues there are)", "payloads"),
                (("session", "put", "s-0123456789abcdef"), "session_not_found: session "
                 "'s-0123456789abcdef' does not exist\n"
                 "muster: see `muster session ls` for the open sessions", "inputs")):
            r = self.muster(*args, stdin="")
            self.assertEqual((r.returncode, r.stdout), (1, ""), (args, r.stderr))
            self.assertEqual(r.stderr, "muster: %s\nmuster: no %s were read from standard "
                             "input either; nothing was put\n" % (says, what))
        self.assertEqual(self.head.request("GET", "/v1/queues/msg-none").json["counts"]["queued"],
                         0)

    def test_map_of_nothing_says_nothing_was_run(self):
        # An empty stdin opened a session on a queue (creating the queue), waited for no
        # result and exited 0 without a word, where `put` of nothing fails saying so.
        for stdin in ("", "\n\r\n\n"):
            r = self.muster("map", "--queue", "msg-map-none", stdin=stdin)
            self.assertEqual((r.returncode, r.stdout), (1, ""), (stdin, r.stderr))
            self.assertEqual(r.stderr, "muster: invalid_argument: no inputs were read from "
                             "standard input; nothing was run on queue 'msg-map-none'\n")
        self.assertEqual(self.head.request("GET", "/v1/queues/msg-map-none").status, 404)

    def test_bad_json_says_why_and_where(self):
        # `update --json '{bad'` said only "DATA is not valid JSON"; the others gave
        # jansson's reason without its place.
        bad = "string or '}' expected near 'bad' (at column 4)"
        for code, args, says in (
                (1, ("update", "--queue", "q", "--json", "{bad"),
                 "invalid_argument: DATA: not valid JSON: " + bad),
                (1, ("update", "--queue", "q", "--json", '{"a":\n bad'),
                 "invalid_argument: DATA: not valid JSON: invalid token near 'bad' (at line 2, "
                 "column 4)"),
                (1, ("put", "--queue", "q", "--json", "1", "{bad"),
                 "invalid_argument: argument 2: not valid JSON: " + bad),
                (1, ("complete", "1", "2", "--json", "{bad"),
                 "invalid_argument: RESULT: not valid JSON: " + bad),
                (2, ("worker", "--queue", "q", "--plugin", "x.so", "--init-data", "{bad"),
                 "--init-data: not valid JSON: " + bad),
                # libmuster parses these two itself; it gave no place.
                (1, ("session", "create", "--queue", "q", "--init-data", "{bad"),
                 "invalid_argument: init_data: not valid JSON: " + bad),
                (1, ("map", "--queue", "q", "--init-data", '{"a": 1,\n "b": bad}'),
                 "invalid_argument: init_data: not valid JSON: invalid token near 'bad' (at "
                 "line 2, column 9)")):
            err = self.fails(code, *args, stdin="1\n")
            self.assertTrue(err.startswith("muster: %s\n" % says), (args, err))
        for cmd in (("put", "--queue", "q", "--json"), ("map", "--queue", "q", "--json")):
            err = self.fails(1, *cmd, stdin="1\n{bad\n")
            self.assertEqual(err, "muster: invalid_argument: stdin line 2: not valid JSON: %s\n"
                             % bad, cmd)

    def test_worker_cache_url_is_checked(self):
        # libmuster refuses a URL without http:// or https://; a worker given one as its
        # node cache's URL learnt it at its first shared-data task, as "out of memory".
        err = self.fails(2, "worker", "--queue", "q", "--cache-url", "127.0.0.1:7371",
                         "--", "/bin/true")
        self.assertTrue(err.startswith("muster: --cache-url '127.0.0.1:7371': it must start "
                                       "with http:// or https://\n"), err)

    def test_bad_json_of_a_file_or_an_agent_says_why_and_where(self):
        # A pretty-printed array with a bad element was read as JSON lines, and said as a
        # bad first line ("line 1: ']' expected near end of file").
        path = os.path.join(self.cwd, "jobs.json")
        with open(path, "w") as f:
            f.write('[\n  {"url": "a.jpg"},\n  {"url": bad}\n]\n')
        for args in (("--file", path), (path,)):
            err = self.fails(1, "put", "--queue", "msg-file", "--json", *args)
            self.assertEqual(err, "muster: invalid_argument: %s: not valid JSON: invalid token "
                             "near 'bad' (at line 3, column 13)\n" % path, args)
        # JSON lines, one of them bad, are still told by line.
        with open(path, "w") as f:
            f.write('[1, 2]\n{"url": bad}\n')
        err = self.fails(1, "put", "--queue", "msg-file", "--json", "--file", path)
        self.assertEqual(err, "muster: invalid_argument: %s line 2: not valid JSON: invalid token "
                         "near 'bad' (at column 11)\n" % path)
        # The agent's --init-data went to its workers unchecked: each refused it and exited
        # 2, and was restarted for ever.
        plugin = os.path.join(node_harness.build_dir(), "libplugin_echo.so")
        for cmd in ("node", "head"):
            r = self.agent(cmd, "--queue", "q", "--plugin", plugin, "--init-data", '{"a":\n bad}')
            self.assertEqual(r.returncode, 2, (cmd, r.stderr))
            self.assertTrue(r.stderr.startswith("muster: --init-data: not valid JSON: invalid "
                                                "token near 'bad' (at line 2, column 4)\n"),
                            r.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.cwd, "agent-head")))

    # ---- the head gone mid-request --------------------------------------------------

    def test_put_cut_off_says_the_batch_may_be_stored(self):
        self.ok("queue", "create", "msg-cut")
        proxy = CutProxy(self.head.port, cut_at=2)
        lines = "".join("%d\n" % i for i in range(2500))
        r = self.muster("put", "--queue", "msg-cut", stdin=lines, url=proxy.url)
        self.assertEqual((r.returncode, len(r.stdout.split())), (1, 1000), r.stderr)
        # The cut batch did land: the message must not say it was not sent.
        counts = self.head.request("GET", "/v1/queues/msg-cut").json["counts"]
        self.assertEqual(counts["queued"], 2000)
        self.assertNotIn("running there?", r.stderr)
        self.assertIn("the server closed the connection without replying", r.stderr)
        # The batches before had the head's replies, which say it is a head.
        self.assertIn("muster: the request was sent, but no reply came back: the head at %s "
                      "may have stopped or restarted; check what the head did before repeating "
                      "it\n" % proxy.url, r.stderr)
        self.assertIn("muster: payloads 1001 to 2000 (of 2500) may or may not be stored (they "
                      "were sent, but no reply came); the 1000 before them are stored", r.stderr)
        self.assertIn("if it is, resume from payload 2001, else from payload 1001", r.stderr)
        # How to see it: the tasks after the last id printed (a plain `tasks ls` lists the
        # queue's oldest 100, which tell nothing of payloads 1001 to 2000).  Found by
        # walk-chaos: the head killed mid-put left a user reading tasks 1 to 100.
        last = r.stdout.split()[-1]
        check = "muster tasks ls --queue msg-cut --after %s --limit 1" % last
        self.assertIn("muster: before sending again, see whether the batch is in queue "
                      "'msg-cut' ('%s' lists payload 1001's task if it is): " % check, r.stderr)
        listed = self.ok(*check.split()[1:] + ["--json"])
        self.assertEqual(json.loads(listed)["payload"], "1000")   # payload 1001: line "1000"

    def test_put_cut_off_with_a_key_prefix_is_run_again_whole(self):
        self.ok("queue", "create", "msg-cut-k")
        proxy = CutProxy(self.head.port, cut_at=2)
        lines = "".join("%d\n" % i for i in range(2500))
        r = self.muster("put", "--queue", "msg-cut-k", "--key-prefix", "run1-", stdin=lines,
                        url=proxy.url)
        self.assertEqual((r.returncode, len(r.stdout.split())), (1, 1000), r.stderr)
        self.assertIn("muster: payloads 1001 to 2000 (of 2500) may or may not be stored (they "
                      "were sent, but no reply came); run the same command again, with the "
                      "same input and --key-prefix: it stores only what is not stored yet, and "
                      "prints every id\n", r.stderr)
        # The cut batch did land; the whole command again stores only payloads 2001-2500
        # and prints the ids of all, the first 2000 as the first run stored them.
        again = self.ok("put", "--queue", "msg-cut-k", "--key-prefix", "run1-", stdin=lines)
        ids = [int(x) for x in again.split()]
        self.assertEqual(len(ids), 2500)
        self.assertEqual(ids[:1000], [int(x) for x in r.stdout.split()])
        counts = self.head.request("GET", "/v1/queues/msg-cut-k").json["counts"]
        self.assertEqual(counts["queued"], 2500)
        task = self.head.request("GET", "/v1/tasks/%d" % ids[1999]).json
        self.assertEqual((task["payload"], task["key"]), ("1999", "run1-2000"))
        # Bad uses are refused before anything is read or sent.
        for args, says in ((("--key-prefix", ""), "--key-prefix is empty"),
                           (("--key-prefix", "p", "--key", "k"), "give --key (one payload) or "
                            "--key-prefix, not both"),
                           (("--key-prefix", "p" * 237), "--key-prefix is 237 bytes; at most "
                            "236")):
            err = self.fails(2, "put", "--queue", "msg-cut-k", *args, "x")
            self.assertTrue(err.startswith("muster: " + says), err)
        self.ok("put", "--queue", "msg-cut-k", "--key-prefix", "p" * 236, "x")
        self.assertEqual(self.head.request("GET", "/v1/queues/msg-cut-k").json["counts"]["queued"],
                         2501)

    def test_put_refused_says_nothing_was_sent(self):
        proxy = CutProxy(self.head.port, cut_at=1)
        proxy.listener.shutdown(socket.SHUT_RDWR)
        proxy.listener.close()
        err = self.fails(1, "put", "--queue", "msg-refused", "a", "b", url=proxy.url)
        self.assertIn("muster: is a muster head or node agent running there? The URL is the "
                      "one MUSTER_URL gives", err)
        self.assertTrue(err.endswith("\nmuster: payloads 1 to 2 (of 2) were not sent; nothing "
                                     "was stored\n"), err)
        # One payload: "payloads 1 to 1 (of 1) were not sent, and the 0 before them are
        # stored (their ids are printed above)".
        err = self.fails(1, "put", "--queue", "msg-refused", "a", url=proxy.url)
        self.assertTrue(err.endswith("\nmuster: payload 1 (of 1) was not sent; nothing was "
                                     "stored\n"), err)
        err = self.fails(1, "session", "put", "s-0123456789abcdef", stdin="a\n", url=proxy.url)
        self.assertTrue(err.endswith("\nmuster: input 1 (of 1) was not sent; nothing was "
                                     "stored\n"), err)

    def test_put_of_one_payload_cut_off(self):
        self.ok("queue", "create", "msg-cut-1")
        proxy = CutProxy(self.head.port, cut_at=1)
        err = self.fails(1, "put", "--queue", "msg-cut-1", "a", url=proxy.url)
        self.assertEqual(self.head.request("GET", "/v1/queues/msg-cut-1").json["counts"]["queued"],
                         1)
        self.assertIn("\nmuster: payload 1 (of 1) may or may not be stored (it was sent, but no "
                      "reply came)\nmuster: before sending again, see whether it is in queue "
                      "'msg-cut-1' ('muster tasks ls --queue msg-cut-1'): if it is, nothing is "
                      "left to send, else send it again\n", err)

    def test_session_put_cut_off(self):
        self.ok("queue", "create", "msg-cut-s")
        sid = self.ok("session", "create", "--queue", "msg-cut-s").strip()
        proxy = CutProxy(self.head.port, cut_at=1)
        err = self.fails(1, "session", "put", sid, stdin="a\n\nb\nc\n", url=proxy.url)
        self.assertEqual(self.head.request("GET", "/v1/sessions/" + sid).json["counts"]["total"],
                         3)
        self.assertNotIn("running there?", err)
        # No reply came at all, so nothing says what answers there.
        self.assertIn("muster: the request was sent, but no reply came back: the muster head or "
                      "node agent at %s may have stopped or restarted; check what the head did "
                      "before repeating it\n" % proxy.url, err)
        self.assertIn("muster: inputs 1 to 3 (of 3) may or may not be stored (they were sent, "
                      "but no reply came)\n", err)
        self.assertIn("see whether the batch is counted in the session's total ('muster session "
                      "show %s'): if it is, nothing is left to send, else send them again\n" % sid,
                      err)

    def test_head_down_is_told_alike_by_every_command(self):
        # map gave no "is a head running there?" and shared put/get gave libcurl's
        # "Failed to connect ... after 0 ms: Couldn't connect to server", as did any
        # command on an https:// URL.
        port = harness.free_port()
        for scheme, args, stdin in (("http", ("queue", "ls"), None),
                                    ("http", ("map", "--queue", "q"), "a\n"),
                                    ("http", ("shared", "put", "s", "n"), "data"),
                                    ("http", ("shared", "get", "s", "n"), None),
                                    ("https", ("queue", "ls"), None)):
            with self.subTest(scheme=scheme, args=args):
                self.check_head_down(scheme, port, args, stdin)

    def check_head_down(self, scheme, port, args, stdin):
        r = self.muster(*args, stdin=stdin, url="%s://127.0.0.1:%d" % (scheme, port))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertRegex(r.stderr, r"\Amuster: network: [A-Z]+ %s://127\.0\.0\.1:%d/v1/\S+: "
                         r"could not connect to 127\.0\.0\.1 port %d: Connection refused\n"
                         r"muster: is a muster head or node agent running there\? The URL is "
                         r"the one MUSTER_URL gives: start it, or give the URL of a running "
                         r"one\n\Z"
                         % (scheme, port, port))

    def test_head_down_names_what_answered_before(self):
        # `status` asks the health first, then the workers: refused by then, the question
        # names what the health's reply said answers at the URL, a head or a node agent.
        for server, who, start in (("muster-node", "the node agent", "it"),
                                   ("muster-head", "the head", "the head")):
            with self.subTest(server=server):
                fake = OneReply(server)
                err = self.fails(1, "status", url=fake.url)
                fake.thread.join(10)
                self.assertTrue(err.endswith(
                    "\nmuster: is %s running there? The URL is the one MUSTER_URL gives: start "
                    "%s, or give the URL of a running one\n" % (who, start)), err)

    def test_head_down_advice_says_where_the_url_came_from(self):
        # It said "Pass --url or set MUSTER_URL" to a user who had passed --url, and to
        # one whose URL came from the url file that a head killed with -9 leaves behind.
        url = "http://127.0.0.1:%d" % harness.free_port()
        err = self.fails(1, "queue", "ls", "--url", url, url=False)
        # Nothing answered there, so nothing says whether a head or a node agent was to.
        self.assertTrue(err.endswith("\nmuster: is a muster head or node agent running there? "
                                     "The URL is the one --url gives: start it, or give the URL "
                                     "of a running one\n"), err)
        killed = os.path.join(self.cwd, "killed-head")  # what a head killed with -9 leaves
        os.makedirs(killed, exist_ok=True)
        with open(os.path.join(killed, "url"), "w") as f:
            f.write(url + "\n")
        err = self.fails(1, "status", "--data-dir", killed, url=False)
        self.assertTrue(err.endswith("\nmuster: is the head running there? The URL was read from "
                                     "%s/url, which a head writes when it listens and leaves "
                                     "behind when it is killed: start that head again, or pass "
                                     "--url (or set MUSTER_URL)\n" % killed), err)
        self.assertNotIn("Pass --url or set MUSTER_URL", err)

    def test_default_url_advice_says_to_start_a_head(self):
        # A new user who ran `muster status` before `muster head`, or away from the head's
        # dir, read "Pass --url or set MUSTER_URL": nothing said that no head was found
        # here, that one may be started, or that --data-dir names a head's dir.
        # The default URL is a fixed port, 7370, which another head on this machine may
        # hold; in a network namespace of its own nothing listens there.
        cmd = [MUSTER, "status"]
        probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up && true"],
                               capture_output=True)
        if probe.returncode == 0:
            cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] + cmd
        else:
            try:
                socket.create_connection(("127.0.0.1", 7370), timeout=2).close()
                self.skipTest("a server listens on 127.0.0.1:7370 and no netns can be made")
            except OSError:
                pass
        empty = tempfile.mkdtemp(prefix="no-head-", dir=self.cwd)  # no ./muster-data here
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=empty, timeout=60,
                           env=self.env(url=False, token=False))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stderr,
                         "muster: network: GET http://127.0.0.1:7370/v1/health: could not connect "
                         "to 127.0.0.1 port 7370: Connection refused\n"
                         "muster: is a muster head or node agent running there? No URL was given "
                         "and ./muster-data has no url file, so the default URL was tried: start "
                         "a head (muster head), pass --url (or set MUSTER_URL), or name a running "
                         "head's data dir with --data-dir (or MUSTER_DATA_DIR)\n")

    # ---- iterations ----------------------------------------------------------------

    def test_iter_options_name_what_is_missing(self):
        # `iter stream --epoch 1` of a one-epoch plan said "invalid_argument: every epoch
        # is done (epochs = 1)", exit 1; stratified without labels named the library's
        # struct field (muster_iter_config_t.labels) or the head's (dataset.labels).
        err = self.fails(2, "iter", "stream", "--num-samples", "10", "--epoch", "1")
        self.assertTrue(err.startswith("muster: --epoch 1 is past the last epoch, 0 (--epochs 1 "
                                       "counts epochs from 0); give --epochs 2 or more, or "
                                       "--epochs 0 for no end\n"), err)
        err = self.fails(2, "iter", "stream", "--num-samples", "10", "--epochs", "3",
                         "--epoch", "3")
        self.assertTrue(err.startswith("muster: --epoch 3 is past the last epoch, 2 "), err)
        self.assertEqual(self.ok("iter", "stream", "--num-samples", "2", "--epochs", "2",
                                 "--epoch", "1"), "0\n1\n")
        self.assertEqual(self.ok("iter", "stream", "--num-samples", "2", "--epochs", "0",
                                 "--epoch", "5"), "0\n1\n")
        for cmd in (["stream"], ["create", "msg-strat"]):
            err = self.fails(2, "iter", *cmd, "--num-samples", "10", "--strategy", "stratified")
            self.assertTrue(err.startswith("muster: --strategy stratified needs --labels FILE: a "
                                           "class label per sample, one per line\n"), err)
        self.assertEqual(self.head.request("GET", "/v1/iterations/msg-strat").status, 404)
        labels = os.path.join(self.cwd, "labels.txt")
        with open(labels, "w") as f:
            f.write("0\n1\n0\n1\n")
        # Classes 0 (samples 0, 2) and 1 (samples 1, 3) dealt to 2 ranks: one of each.
        self.assertEqual(self.ok("iter", "stream", "--num-samples", "4", "--strategy",
                                 "stratified", "--labels", labels, "--world-size", "2"),
                         "0\n1\n")

    def test_iter_numbers_of_32_bits_are_not_cut_to_their_low_bits(self):
        # A rank, world size or number of partitions was cut to 32 bits: --rank 4294967296
        # leased rank 0's blocks, --world-size 4294967297 streamed as world size 1.
        self.assertEqual(self.ok("iter", "create", "msg-rank", "--num-samples", "8",
                                 "--world-size", "2", "--block-size", "4")[:1], "{")
        for args, said in (
                (["next", "msg-rank", "--rank", "4294967296"],
                 "--rank: must be at most 65535, got 4294967296"),
                (["held", "msg-rank", "--rank", "4294967296"],
                 "--rank: must be at most 65535, got 4294967296"),
                (["ack", "msg-rank", "--rank", "4294967296", "0:1"],
                 "--rank: must be at most 65535, got 4294967296"),
                (["create", "msg-rank", "--num-samples", "8", "--world-size", "2",
                  "--block-size", "4", "--rank", "65536"],
                 "--rank: must be at most 65535, got 65536"),
                (["stream", "--num-samples", "4", "--world-size", "2", "--rank", "4294967297"],
                 "--rank: must be at most 65535, got 4294967297"),
                (["stream", "--num-samples", "4", "--world-size", "4294967297"],
                 "--world-size: must be at most 65536, got 4294967297"),
                (["stream", "--num-samples", "4", "--strategy", "hash", "--num-partitions",
                  "4294967297"], "--num-partitions: must be at most 4294967295, got 4294967297")):
            err = self.fails(2, "iter", *args)
            self.assertTrue(err.startswith("muster: %s\n" % said), (args, err))
        ck = os.path.join(self.cwd, "msg-rank.json")
        with open(ck, "w") as f:
            f.write(self.ok("iter", "checkpoint", "msg-rank"))
        err = self.fails(2, "iter", "restore", "msg-rank2", ck, "--world-size", "4294967298")
        self.assertTrue(err.startswith("muster: --world-size: must be at most 65536, got "
                                       "4294967298\n"), err)
        self.assertEqual(self.head.request("GET", "/v1/iterations/msg-rank2").status, 404)
        held = self.head.request("GET", "/v1/iterations/msg-rank/held?rank=0").json
        self.assertEqual(held["blocks"], [], held)

    def test_iter_labels_file_is_read_as_the_head_reads_labels(self):
        # fscanf's %lu read 4294967297 as class 1 and -1 as 4294967295, stopped at a word
        # such as "x" saying only that the file had fewer labels, took a file with more
        # labels than samples without a word, and a file it could not open said no why.
        path = os.path.join(self.cwd, "bad-labels.txt")
        stratified = ("iter", "stream", "--num-samples", "3", "--strategy", "stratified",
                      "--world-size", "2", "--labels", path)
        for text, said in (
                ("0\n4294967297\n0\n", "label 2, '4294967297', is not a class label"),
                ("0\n-1\n0\n", "label 2, '-1', is not a class label"),
                ("0\n1\nx\n", "label 3, 'x', is not a class label"),
                ("0\n1048576\n0\n", "label 2, '1048576', is not a class label")):
            with open(path, "w") as f:
                f.write(text)
            err = self.fails(2, *stratified)
            self.assertTrue(err.startswith("muster: --labels: %s: %s (a whole number from 0 to "
                                           "1048575, one per line)\n" % (path, said)), err)
        with open(path, "w") as f:
            f.write("0\n1\n0\n1\n")
        err = self.fails(2, *stratified)
        self.assertTrue(err.startswith("muster: --labels: %s has 4 labels, the dataset 3 "
                                       "samples\n" % path), err)
        os.unlink(path)
        err = self.fails(2, *stratified)
        self.assertTrue(err.startswith("muster: --labels: cannot open '%s': No such file or "
                                       "directory\n" % path), err)

    def test_iter_seed_without_shuffle_is_noted(self):
        # tenflowers' with_shuffle_seed(42) shuffles; muster's --seed alone does not, and
        # the CLI printed the unshuffled order without a word.
        note = ("muster: note: --seed 42 changes nothing while --shuffle is none (the "
                "default): the order is not shuffled; give --shuffle global (or shard) for a "
                "seeded order\n")
        for shuffle in ((), ("--shuffle", "none")):
            r = self.muster("iter", "stream", "--num-samples", "4", "--world-size", "2",
                                "--seed", "42", *shuffle)
            self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "0\n2\n", note))
        r = self.muster("iter", "create", "msg-seed", "--num-samples", "4", "--seed", "42")
        self.assertEqual((r.returncode, r.stderr), (0, note))
        self.assertEqual(json.loads(r.stdout)["config"]["shuffle"], "none")
        r = self.muster("iter", "stream", "--num-samples", "4", "--world-size", "2",
                            "--seed", "42", "--shuffle", "global")
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertEqual(self.ok("iter", "stream", "--num-samples", "4"), "0\n1\n2\n3\n")

    # ---- shared data ---------------------------------------------------------------

    def test_shared_put_existing_names_the_option(self):
        self.ok("shared", "put", "msg-exists", "w", stdin="a")
        self.ok("shared", "put", "msg-exists", "w", "--level", "2", stdin="b")
        err = self.fails(1, "shared", "put", "msg-exists", "w", stdin="c")
        self.assertEqual(err, "muster: version_mismatch: shared data 'w' exists at level 2; "
                         "update it with --level 3\n")
        self.ok("shared", "rm", "msg-exists", "w")

    def test_shared_update_of_a_blob_never_set(self):
        # ALPCRUN's UpdateSharedData before any SetSharedData (or after a delete): it said
        # only "expected 1, got 2", not that the blob has no level nor how to start one.
        err = self.fails(1, "shared", "put", "msg-never", "w", "--level", "2", stdin="a")
        self.assertEqual(err, "muster: version_mismatch: update level mismatch: expected 1, got 2 "
                         "('w' has no level in scope 'msg-never': it was never set, or was "
                         "deleted; a new blob starts at level 1)\n"
                         "muster: put it again without --level to start it at level 1\n")

    def test_shared_expired_after_the_sweep(self):
        self.ok("shared", "put", "msg-ttl", "gone", "--ttl-ms", "200", stdin="a")
        # The head logs each blob its sweep deletes.
        harness.wait_until(lambda: "shared data 'gone' in scope 'msg-ttl' expired"
                           in self.head.log(), what="the sweep to delete the expired blob")
        expired = "('gone' expired: it was not updated within its ttl_ms of 200)"
        err = self.fails(1, "shared", "get", "msg-ttl", "gone")
        self.assertEqual(err, "muster: shared_not_found: shared data not found: 'gone' in scope "
                         "'msg-ttl' %s\n" % expired)
        err = self.fails(1, "shared", "put", "msg-ttl", "gone", "--level", "2", stdin="b")
        self.assertEqual(err, "muster: version_mismatch: update level mismatch: expected 1, got 2 "
                         "('gone' expired: it was not updated within its ttl_ms of 200; a new "
                         "blob starts at level 1)\n"
                         "muster: put it again without --level to start it at level 1\n")
        self.ok("shared", "put", "msg-ttl", "gone", stdin="c")
        self.ok("shared", "rm", "msg-ttl", "gone")

    # ---- agent options -------------------------------------------------------------

    def agent(self, cmd, *args):
        """`muster node` or `muster head` with its own lock file (and data dir): an
        option it refuses must stop it at once, before it joins or serves anything."""
        lock = os.path.join(self.cwd, "agent.lock")
        extra = ["--join", self.head.url, "--listen", "none", "--name", "msg-agent"]
        if cmd == "head":
            extra = ["--listen", "127.0.0.1:0", "--data-dir", os.path.join(self.cwd, "agent-head")]
        return subprocess.run([MUSTER, cmd] + extra + ["--lock-file", lock] + list(args),
                              capture_output=True, text=True, env=self.env(), cwd=self.cwd,
                              timeout=20)

    def test_agent_refuses_worker_options_its_workers_would_refuse(self):
        # A worker takes --concurrency up to 1024: an agent that passed 2000 on started
        # workers that exited 2 at once, restarted for ever.  --workers above the agent's
        # 1024 was cut to 1024 without a word, and 4294967297 became 1 (an int cast).
        for cmd in ("node", "head"):
            for opts, says in ((("--concurrency", "2000"), "--concurrency: at most 1024, got 2000"),
                               (("--workers", "4294967297"), "--workers: at most 1024, got "
                                "4294967297")):
                r = self.agent(cmd, "--queue", "q", *opts, "--", "cat")
                self.assertEqual(r.returncode, 2, (cmd, opts, r.stderr))
                self.assertTrue(r.stderr.startswith("muster: %s\n" % says), r.stderr)

    def test_head_checks_its_agent_options_before_it_starts(self):
        # They were read by the local agent alone, after the head had started: the head
        # ran on without workers, the mistake one line among its log lines.  --gpus and
        # --name were still left to the agent.
        for opts, says in ((("--queue", "q"), "--queue needs a worker: -- CMD [ARGS...] or "
                            "--plugin PATH"),
                           (("--workers", "abc"), "--workers: expected an integer, got 'abc'"),
                           (("--gpus", "bogus"), "--gpus: 'bogus' is not a list of GPU indexes "
                            "or UUIDs such as 0,2 or GPU-8f1c (a MIG instance: 0:1 or MIG-5a2e)"),
                           (("--gpus", "0,0:x"), "--gpus: '0,0:x' is not a list of GPU indexes "
                            "or UUIDs such as 0,2 or GPU-8f1c (a MIG instance: 0:1 or MIG-5a2e): "
                            "'0:x' is neither"),
                           (("--name", "a b"), "node name 'a b': use 1 to 128 characters of "
                            "letters, digits, '.', '_' and '-', other than '.' and '..' "
                            "(--name)"),
                           (("--name", ".."), "node name '..': '.' and '..' are no names: URLs "
                            "collapse them (--name)")):
            r = self.agent("head", *opts)
            self.assertEqual(r.returncode, 2, (opts, r.stderr))
            self.assertTrue(r.stderr.startswith("muster: %s\n" % says), r.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.cwd, "agent-head")))

    def test_head_checks_gpu_uuids_against_this_machines_gpus(self):
        # A --gpus UUID is looked up among the GPUs found here (nvidia-smi -L, faked),
        # as the agent would, before the head starts.
        fake = os.path.join(self.cwd, "fake-smi")
        os.makedirs(fake, exist_ok=True)
        with open(os.path.join(fake, "nvidia-smi"), "w") as f:
            f.write('#!/bin/sh\n[ "$1" = -L ] || exit 9\n'
                    'echo "GPU 0: Fake GPU (UUID: GPU-a1599801-2c3d-4e5f-8a9b-0c1d2e3f4a5b)"\n')
        os.chmod(os.path.join(fake, "nvidia-smi"), 0o755)
        env = self.env()
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env["MUSTER_NVML_LIBRARY"] = "/nonexistent/libnvidia-ml.so.1"
        env["PATH"] = fake + ":" + env.get("PATH", "/usr/bin:/bin")
        data = os.path.join(self.cwd, "gpu-head")
        r = subprocess.run([MUSTER, "head", "--listen", "127.0.0.1:0", "--data-dir", data,
                            "--lock-file", os.path.join(self.cwd, "agent.lock"),
                            "--gpus", "GPU-ffff"], capture_output=True, text=True, env=env,
                           cwd=self.cwd, timeout=20)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertTrue(r.stderr.startswith(
            "muster: --gpus: 'GPU-ffff' matches no GPU of this machine; its GPUs are 0 "
            "GPU-a1599801-2c3d-4e5f-8a9b-0c1d2e3f4a5b (name them by index or UUID)\n"), r.stderr)
        self.assertFalse(os.path.exists(data))

    def test_head_server_only_refuses_agent_options(self):
        # --server-only starts no agent: its options and a worker command were dropped
        # without a word, and the head ran with no worker.
        data = os.path.join(self.cwd, "server-only-head")
        for opts, named in ((("--queue", "q", "--workers", "3", "--", "cat"),
                             "--queue, --workers, a worker command (after --)"),
                            (("--gpus=0", "--json-result"), "--gpus, --json-result"),
                            (("--", "cat"), "a worker command (after --)")):
            r = subprocess.run([MUSTER, "head", "--listen", "127.0.0.1:0", "--data-dir", data,
                                "--server-only"] + list(opts), capture_output=True, text=True,
                               env=self.env(), cwd=self.cwd, timeout=20)
            self.assertEqual(r.returncode, 2, (opts, r.stderr))
            self.assertTrue(r.stderr.startswith(
                "muster: --server-only starts no local node agent, so its options are refused: "
                "%s; drop them, or drop --server-only to run the agent beside the head\n"
                % named), r.stderr)
            self.assertFalse(os.path.exists(data))

    def test_plugin_check_ends_with_the_load_not_with_its_daemon(self):
        # The start check read the loading child's pipe to its end: a constructor that
        # forks a daemon (which keeps the pipe open) held the start for the whole limit,
        # then failed it as a load that hangs.  The daemon outlives the check here.
        plugin = os.path.join(node_harness.build_dir(), "libplugin_daemon.so")
        pids = os.path.join(self.cwd, "daemon-pids")
        self.addCleanup(self.kill_daemons, pids)
        data = os.path.join(self.cwd, "daemon-head")
        env = dict(self.env(), PLUGIN_DAEMON_PIDS=pids, MUSTER_PLUGIN_CHECK_TIMEOUT_MS="20000")
        # A plugin no worker can load is refused with its reason; one that loads passes
        # the check, and the next check (of --gpus) speaks: nothing was started.
        for extra_env, opts, says in (
                ({"PLUGIN_DAEMON_NO_RUN": "1"}, (), "muster head: plugin %s: it has no init or "
                 "run; no worker was started\n" % plugin),
                ({}, ("--gpus", "bogus"), "muster: --gpus: 'bogus' is not a list of GPU")):
            # Its output goes to a file: the daemon holds a pipe's write end open too.
            with tempfile.TemporaryFile("w+") as out:
                code = subprocess.call([MUSTER, "head", "--listen", "127.0.0.1:0", "--data-dir",
                                        data, "--lock-file", os.path.join(self.cwd, "agent.lock"),
                                        "--queue", "q", "--plugin", plugin] + list(opts),
                                       stdout=out, stderr=out, env=dict(env, **extra_env),
                                       cwd=self.cwd, timeout=60)
                out.seek(0)
                err = out.read()
            self.assertEqual(code, 2, err)
            self.assertTrue(err.startswith(says), err)
            self.assertFalse(os.path.exists(data))
        with open(pids) as f:
            daemons = [int(line) for line in f]
        self.assertEqual(len(daemons), 2)
        self.assertTrue(all(node_harness.alive(pid) for pid in daemons), daemons)

    @staticmethod
    def kill_daemons(pids):
        try:
            with open(pids) as f:
                for line in f:
                    try:
                        os.kill(int(line), 9)
                    except ProcessLookupError:
                        pass
        except FileNotFoundError:
            pass

    def test_options_of_another_command_say_which_command_takes_them(self):
        # `muster head --join URL` answered "unrecognized option '--join'": someone who
        # wants a node agent was left to guess.  head, node and worker options taken for
        # one another's name the command that takes them and what to run instead.
        data = os.path.join(self.cwd, "misplaced-head")
        for cmd, opts, says in (
                ("head", ("--join", self.head.url),
                 "--join is an option of `muster node`, not of `muster head`: a head is what "
                 "nodes join; on another machine run `muster node --join URL"),
                ("head", ("--url=" + self.head.url,), "--url names the head to the commands "
                 "that talk to one, not to `muster head`: a head listens with --listen"),
                ("node", ("--server-only",), "--server-only is an option of `muster head` (a "
                 "head without its local node agent); `muster node` runs no head"),
                ("node", ("--sweep-ms", "50"), "--sweep-ms is an option of `muster head`, not "
                 "of `muster node`: the head keeps the state"),
                ("node", ("--max-tasks", "3"), "--max-tasks is an option of `muster worker`, "
                 "not of `muster node`: the agent starts its workers itself"),
                ("node", (self.head.url,), "'%s' looks like the head's URL: give it as --join "
                 "%s (a worker command goes after --)" % (self.head.url, self.head.url)),
                ("node", (self.head.url, "--queue", "q", "--", "cat"), "'%s' looks like the "
                 "head's URL: give it as --join %s" % (self.head.url, self.head.url)),
                ("worker", ("--queue", "q", "--gpus", "0", "--", "cat"), "--gpus is an option "
                 "of `muster node`, not of `muster worker`: `muster node --join URL --queue Q "
                 "-- CMD` starts one worker per GPU"),
                # The GPU worker pool's words (docs/coming-from.md): its password is
                # muster's token, and its `start_node --head` is `muster head`.
                ("head", ("--password=12345678",), "--password is not an option of muster: "
                 "the head's token takes the place of a pool's password (`muster head --token "
                 "SECRET`, 8 to 255 characters), and a node joins with `muster node --join "
                 "http://HEAD:7370 --token SECRET`"),
                ("node", ("--password", "12345678", "--join", self.head.url), "--password is "
                 "not an option of muster: the head's token takes the place"),
                ("node", ("--head",), "--head is not an option of `muster node`: a head is a "
                 "command of its own, `muster head --listen 0.0.0.0:7370 --token SECRET`"),
                # ... and its short options (`start_node -p PORT -a ADDRESS -r PASSWORD`).
                ("node", ("-p", "8899", "-a", "10.0.0.1", "-r", "123456"), "-p (a pool's port) "
                 "is not an option of muster: a node agent joins its head with --join "
                 "http://HEAD:7370"),
                ("node", ("-a", "10.0.0.1"), "-a (a pool's address) is not an option of muster: "
                 "the head's address goes in the URL of --join http://ADDRESS:7370"),
                ("node", ("-r", "123456"), "-r (a pool's password) is not an option of muster: "
                 "a node joins with the head's token"),
                ("head", ("-p", "8899"), "-p (a pool's port) is not an option of muster: a head "
                 "listens with --listen ADDR:PORT"),
                ("head", ("-r", "123456"), "-r (a pool's password) is not an option of muster: "
                 "the head's token takes its place"),
                # ... and their long forms, beside --password (they said "unknown option").
                ("node", ("--port", "8899"), "--port (a pool's port) is not an option of "
                 "muster: a node agent joins its head with --join http://HEAD:7370"),
                ("node", ("--address=10.0.0.1",), "--address (a pool's address) is not an "
                 "option of muster: the head's address goes in the URL of --join "
                 "http://ADDRESS:7370"),
                ("head", ("--port", "8899"), "--port (a pool's port) is not an option of "
                 "muster: a head listens with --listen ADDR:PORT (0.0.0.0:7370"),
                ("head", ("--address", "0.0.0.0"), "--address (a pool's address) is not an "
                 "option of muster: a head listens with --listen ADDR:PORT")):
            args = [MUSTER, cmd] + list(opts)
            if cmd == "head":
                args += ["--listen", "127.0.0.1:0", "--data-dir", data]
            r = subprocess.run(args, capture_output=True, text=True, env=self.env(),
                               cwd=self.cwd, timeout=20)
            self.assertEqual((r.returncode, r.stdout), (2, ""), (cmd, opts, r.stderr))
            self.assertTrue(r.stderr.startswith("muster: " + says), (cmd, opts, r.stderr))
            self.assertTrue(r.stderr.endswith("Try 'muster %s --help' for more information.\n"
                                              % cmd), r.stderr)
            self.assertFalse(os.path.exists(data))
        # The head's URL given to `muster head` (as to `muster node --join`).
        r = subprocess.run([MUSTER, "head", self.head.url, "--listen", "127.0.0.1:0",
                            "--data-dir", data], capture_output=True, text=True,
                           env=self.env(), cwd=self.cwd, timeout=20)
        self.assertEqual((r.returncode, r.stdout), (2, ""), r.stderr)
        self.assertEqual(r.stderr, "muster head: unexpected argument '%s': a head joins nothing, "
                         "it listens (--listen ADDR:PORT); to join the head at that URL from "
                         "this machine, run `muster node --join %s`\n"
                         % (self.head.url, self.head.url))
        self.assertFalse(os.path.exists(data))
        # Unknown everywhere: still "unknown option".
        err = self.fails(2, "node", "--bogus")
        self.assertTrue(err.startswith("muster: unknown option '--bogus' for 'node'\n"), err)

    # ---- empty names ---------------------------------------------------------------

    def test_empty_names_are_refused_not_routed_elsewhere(self):
        # An empty name (an unset shell variable) makes a path with an empty segment,
        # which once collapsed into another endpoint: `shared get '' w` printed the listing
        # of scope 'w' and exited 0, `tasks ls --queue ''` spoke of a queue 'tasks'.
        self.ok("shared", "put", "w", "blob", stdin="data")
        r = self.muster("shared", "get", "", "w")
        self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
        self.assertTrue(r.stderr.startswith("muster: name_invalid: scope '': "), r.stderr)
        self.assertEqual(self.head.request("GET", "/v1/shared//w").error_code, "name_invalid")
        for args in (("tasks", "ls", "--queue", ""), ("tasks", "dead", "--queue", ""),
                     ("put", "--queue", "", "x"), ("lease", "--queue", ""),
                     ("queue", "purge", ""), ("update", "--queue", "", "x")):
            err = self.fails(1, *args)
            # A name no queue could have is name_invalid, as `queue create ''` says.
            self.assertEqual(err, "muster: name_invalid: queue name '' is invalid: use 1 to 128 "
                             "characters of letters, digits, '.', '_' and '-', other than '.' "
                             "and '..'\n", args)


if __name__ == "__main__":
    unittest.main()
