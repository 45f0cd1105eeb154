"""The help of every `muster` command: option lists laid out in one column that fits a
terminal, and `muster help` as docs/cli.md describes it.  No head is needed.
"""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "cli.md")

# The headers under which a help text lists options or commands, one per line.
LIST_HEADER = re.compile(r"^(options|client options|commands|subcommands|local node agent .*):$")
# An item: two spaces, a name of words with single spaces ("-h, --help", "queue create"),
# at least two spaces, then its description.
ITEM = re.compile(r"^  (\S+(?: \S+)*)(?: {2,}(\S.*))?$")
COLUMNS = 80


def run(*args):
    return subprocess.run([MUSTER] + list(args), capture_output=True, text=True, timeout=30)


def list_problems(text):
    """What is wrong with the option and command lists of help `text`: descriptions that
    do not all start in one column (continuation lines included), an item that runs
    into its description, lines wider than COLUMNS.  An empty list when none."""
    problems, columns, header, lone = [], set(), None, False
    for line in text.splitlines():
        if LIST_HEADER.match(line):
            header = line
            continue
        if not line.strip():
            header = None
            continue
        if header is None:
            continue
        if len(line) > COLUMNS:
            problems.append("wider than %d: %r" % (COLUMNS, line))
        if line.startswith("   "):  # a description's next line
            columns.add(len(line) - len(line.lstrip(" ")))
            lone = False
            continue
        if lone:
            problems.append("an item alone on its line, not followed by its description")
        item = ITEM.match(line)
        if item is None:
            problems.append("not an item: %r" % line)
            continue
        lone = item.group(2) is None
        if not lone:
            columns.add(line.index(item.group(2), 2 + len(item.group(1))))
    if lone:
        problems.append("the last item is alone on its line")
    if len(columns) > 1:
        problems.append("descriptions start in columns %s" % sorted(columns))
    return problems


class CliHelpTest(unittest.TestCase):
    def commands(self):
        """Every command and group `muster --help` lists, as lists of words."""
        r = run("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        names = re.findall(r"^  ([a-z]+(?: [a-z]+)?)  ", r.stdout, re.M)
        self.assertIn("iter create", names)
        groups = sorted({n.split()[0] for n in names if " " in n})
        return [n.split() for n in names] + [[g] for g in groups]

    def test_every_help_lists_in_one_column_within_80_columns(self):
        # `iter create --help` printed "--shuffle-block-size N shard mode: ...": the
        # widest option ran into its description, and many lines ran past 80 columns.
        self.assertEqual(list_problems(run("--help").stdout), [])
        for words in self.commands():
            r = run(*(words + ["--help"]))
            self.assertEqual(r.returncode, 0, (words, r.stderr))
            self.assertEqual(list_problems(r.stdout), [], words)
        shuffle = [line for line in run("iter", "create", "--help").stdout.splitlines()
                   if line.startswith("  --shuffle-block-size N")]
        self.assertEqual(len(shuffle), 1)
        self.assertRegex(shuffle[0], r"^  --shuffle-block-size N {2,}shard mode: ")

    def test_head_help_fits_80_columns(self):
        # head_options.c prints the head's own options, and their lines reached 88
        # columns, while the local agent's, printed by the CLI after them, were wrapped.
        r = run("head", "--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("\noptions:\n  --listen ADDR:PORT", r.stdout)
        self.assertIn("\nlocal node agent ", r.stdout)
        self.assertEqual(list_problems(r.stdout), [])

    def test_the_check_sees_a_misaligned_list(self):
        text = ("options:\n"
                "  --seed S               shuffle seed\n"
                "  --shuffle-block-size N shard mode\n"
                "  --strategy S           round_robin\n")
        self.assertEqual(list_problems(text),
                         ["an item alone on its line, not followed by its description"])
        self.assertEqual(list_problems("options:\n  --a   x\n  --bb   y\n"),
                         ["descriptions start in columns [8, 9]"])

    def test_help_takes_a_command_and_its_subcommand_as_the_docs_say(self):
        # The usage said `help [COMMAND]`, the docs `help COMMAND [SUBCOMMAND]`.
        r = run("help", "--help")
        synopsis = "muster help [COMMAND [SUBCOMMAND]]"
        self.assertEqual(r.stdout.splitlines()[0], "usage: " + synopsis)
        with open(DOCS) as f:
            docs = " ".join(f.read().split())
        self.assertIn("`%s`" % synopsis, docs)
        self.assertIn("usage: muster queue create NAME", run("help", "queue", "create").stdout)
        self.assertIn("usage: muster queue SUBCOMMAND", run("help", "queue").stdout)
        self.assertIn("muster help COMMAND [SUBCOMMAND]", run("--help").stdout)
        r = run("help", "queue", "create", "extra")
        self.assertEqual(r.returncode, 2, r.stderr)

    def test_every_synopsis_of_the_docs_names_every_option_of_the_help(self):
        # docs/cli.md's `worker` lacked --plugin, --init-data and --cache-url, its `node`
        # --concurrency, --nickname, --json-result, --cache-dir, --cache-bytes and
        # --state-dir.  Commands whose synopsis lives elsewhere (pools.md) are skipped.
        with open(DOCS) as f:
            # Plain blocks: a ```sh block (a script) is an example, not a synopsis, and
            # its fence must not pair with the next block's.
            blocks = [code for lang, code in re.findall(r"^```(\w*)\n(.*?)^```", f.read(),
                                                         re.S | re.M) if not lang]
        checked = []
        for words in self.commands():
            name = " ".join(words)
            synopsis = "\n".join(b for b in blocks
                                 if re.search(r"^muster %s(?: |$)" % re.escape(name), b, re.M))
            if not synopsis or name in ("head", "help", "version"):
                continue
            text = run(*(words + ["--help"])).stdout
            own = text.split("\noptions:\n", 1)[-1].split("\nclient options:\n")[0]
            options = re.findall(r"^  (--[a-z-]+)", own, re.M) if "\noptions:\n" in text else []
            missing = [o for o in options if not re.search(re.escape(o) + r"\b", synopsis)]
            with self.subTest(command=name):
                self.assertEqual(missing, [], "docs/cli.md's synopsis of '%s' lacks them" % name)
            checked.append(name)
        self.assertIn("worker", checked)
        self.assertIn("node", checked)

    def test_usage_names_both_things_a_worker_runs(self):
        # `worker --help`'s usage showed `-- CMD [ARGS...]` alone, though --plugin PATH
        # runs a plugin instead; `node --help`'s likewise.
        for words, usage in ((["worker"], "muster worker --queue Q [options] "
                              "(-- CMD [ARGS...] | --plugin PATH)"),
                             (["node"], "muster node [--join URL] [options] "
                              "[-- CMD [ARGS...] | --plugin PATH]")):
            lines = run(*(words + ["--help"])).stdout.splitlines()
            self.assertEqual(lines[0], "usage: " + usage)
            self.assertLessEqual(len(lines[0]), COLUMNS)
        self.assertEqual(run("worker", "--help").stdout.splitlines()[2],
                         "Run CMD or a plugin for each task of a queue.")

    def test_acknowledgements_say_where_task_and_token_come_from(self):
        # "usage: muster complete TASK TOKEN [RESULT]" alone left a new user to guess
        # which token (the admin token is also a "token") and where the two come from.
        for command in ("complete", "fail", "extend", "release", "flag"):
            with self.subTest(command=command):
                out = run(command, "--help").stdout
                self.assertIn('TASK and TOKEN are the "task" and "token" of a lease, as '
                              '`muster lease`\nprints them', out)
                # Each shows itself after the lease: `muster fail --help` showed only
                # `muster complete 7 1042 a-small.jpg`.
                example = out[out.index("\nexample:\n"):].splitlines()
                self.assertTrue(example[2].startswith("  muster lease --queue"), example)
                self.assertTrue(example[3].startswith("  muster %s 7 1042" % command), example)

    def test_help_of_an_unknown_name_says_what_running_it_says(self):
        # `help queue nosuch` said "unknown command 'queue nosuch'" and `queue nosuch`
        # "unknown subcommand": the same mistake is told the same way.
        for words in (["queue", "nosuch"], ["nosuch"]):
            r, helped = run(*words), run("help", *words)
            self.assertEqual((helped.returncode, helped.stderr), (2, r.stderr))
            self.assertEqual(helped.stdout, "")
        self.assertTrue(run("queue", "nosuch").stderr.startswith(
            "muster: unknown subcommand 'queue nosuch'\n"))
        r = run("help", "version", "x")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr, "muster: 'version' has no subcommand 'x'\n"
                         "Try 'muster help version' for its usage.\n")


if __name__ == "__main__":
    unittest.main()
