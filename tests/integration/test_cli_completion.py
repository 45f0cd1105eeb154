"""`muster completion bash|zsh`: the completion script, driven as the shell drives it.

Each case loads the script into `bash --norc` (no bash-completion package), sets
COMP_WORDS and COMP_CWORD as bash does for a TAB (bash splits `--order=co` into
`--order`, `=`, `co`) and calls its function, then reads COMPREPLY.  The script is made
from the binary's tables, so the tests hold it to what `--help` says: every command
`muster --help` lists is offered, and each command offers exactly the options its
`--help` prints.  The words offered for an option's value are each accepted by that
option's parser (and a word that is none of them refused), so that they cannot drift
apart.  No head is needed: the script never asks one.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
BUILD = os.environ.get("MUSTER_BUILD_DIR") or os.path.dirname(os.path.abspath(MUSTER))
DEAD_URL = "http://127.0.0.1:1"  # nothing listens: a request fails at once, exit 1

# Calls the completion function for the words given as arguments (the last is the one
# completed) and prints COMPREPLY, one per line.
DRIVE = 'source "$SCRIPT" || exit 9; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); ' \
        '_muster; printf "%s\\n" "${COMPREPLY[@]}"'

# One command line per option whose value the script completes with words, with
# VALUE where the value goes: run with each word offered, the option's parser takes
# it; run with a word that is none of them, the command refuses it.
PROBES = {
    "order": ["session", "results", "1", "--order", "VALUE", "--url", DEAD_URL],
    "state": ["tasks", "ls", "--queue", "q", "--state", "VALUE", "--url", DEAD_URL],
    "shuffle": ["iter", "stream", "--num-samples", "4", "--shuffle", "VALUE"],
    "strategy": ["iter", "stream", "--num-samples", "4", "--strategy", "VALUE"],
    "tail": ["iter", "stream", "--num-samples", "4", "--tail", "VALUE"],
    "cluster-sync": ["iter", "create", "i", "--num-samples", "4", "--cluster-sync", "VALUE",
                     "--url", DEAD_URL],
    # --listen nope fails the parse after the option tried (they are read in order),
    # so that no head starts.
    "sync": ["head", "--server-only", "--sync", "VALUE", "--listen", "nope"],
    "log-level": ["head", "--server-only", "--log-level", "VALUE", "--listen", "nope"],
}


def run(*args, **kw):
    return subprocess.run([MUSTER] + list(args), capture_output=True, text=True, timeout=30,
                          **kw)


def help_commands():
    """Every command `muster --help` lists, as lists of words."""
    r = run("--help")
    assert r.returncode == 0, r.stderr
    return [n.split() for n in re.findall(r"^  ([a-z]+(?: [a-z]+)?)  ", r.stdout, re.M)]


def help_options(words):
    """The long options `muster WORDS --help` lists (-h, --help among them)."""
    r = run(*(words + ["--help"]))
    assert r.returncode == 0, (words, r.stderr)
    return set(re.findall(r"^  (?:-h, )?(--[a-z][a-z0-9-]*)", r.stdout, re.M))


def expected_words(refusal):
    """The words a refusal of an option's value says it takes, sorted: "expected full or
    normal", "'x' is not one of none, global, shard"."""
    found = re.search(r"(?:expected|is not one of) ([a-z_]+(?:(?:, (?!got )| or )[a-z_]+)*)",
                      refusal)
    assert found, refusal
    return sorted(re.split(r", | or ", found.group(1)))


class CompletionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="muster-completion-")
        cls.script = os.path.join(cls.tmp, "muster.bash")
        r = run("completion", "bash")
        assert r.returncode == 0, r.stderr
        with open(cls.script, "w") as f:
            f.write(r.stdout)
        cls.cwd = os.path.join(cls.tmp, "cwd")  # files and directories to complete
        os.makedirs(os.path.join(cls.cwd, "models"))
        for name in ("jobs.txt", "ckpt.json"):
            open(os.path.join(cls.cwd, name), "w").close()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def complete(self, *words):
        """What the script offers for the last of `words` (a `muster` command line as
        bash splits it), sorted."""
        r = subprocess.run(["bash", "--norc", "-c", DRIVE, "bash"] + list(words),
                           capture_output=True, text=True, timeout=30, cwd=self.cwd,
                           env=dict(os.environ, SCRIPT=self.script))
        self.assertEqual((r.returncode, r.stderr), (0, ""), words)
        return sorted(line for line in r.stdout.splitlines() if line)

    def test_first_word_is_every_command_of_help(self):
        firsts = sorted({words[0] for words in help_commands()})
        self.assertIn("completion", firsts)
        self.assertEqual(self.complete("muster", ""), firsts)
        self.assertEqual(self.complete("muster", "qu"), ["queue"])
        self.assertEqual(self.complete("muster", "sess"), ["session"])

    def test_second_word_of_a_group(self):
        self.assertEqual(self.complete("muster", "queue", ""),
                         ["create", "ls", "purge", "requeue", "rm", "show", "wait"])
        self.assertEqual(self.complete("muster", "queue", "c"), ["create"])
        for group in sorted({w[0] for w in help_commands() if len(w) == 2}):
            subs = sorted(w[1] for w in help_commands() if len(w) == 2 and w[0] == group)
            self.assertEqual(self.complete("muster", group, ""), subs, group)

    def test_every_command_offers_the_options_of_its_help(self):
        # A command added to the table without completion, or an option added to one,
        # would differ here (`muster head` prints its help apart from its parser).
        for words in help_commands():
            offered = set(self.complete(*(["muster"] + words + ["--"])))
            self.assertEqual(offered, help_options(words), words)

    def test_options_of_put(self):
        self.assertEqual(self.complete("muster", "put", "--q"), ["--queue"])
        self.assertEqual(self.complete("muster", "put", "--j"), ["--json"])
        self.assertEqual(self.complete("muster", "put", "--queue", "q", "--ke"),
                         ["--key", "--key-prefix"])
        # A value that is anything (a queue name: only a head knows them) gets nothing,
        # neither options nor files.
        self.assertEqual(self.complete("muster", "put", "--queue", ""), [])

    def test_values_of_order(self):
        self.assertEqual(self.complete("muster", "session", "results", "7", "--order", ""),
                         ["completion", "submission"])
        self.assertEqual(self.complete("muster", "session", "results", "7", "--order", "c"),
                         ["completion"])
        # --order=co, which bash splits at the '='
        self.assertEqual(self.complete("muster", "session", "results", "7", "--order", "=", "co"),
                         ["completion"])
        self.assertEqual(self.complete("muster", "session", "results", "7", "--order", "="),
                         ["completion", "submission"])
        # as zsh gives it, one word
        self.assertEqual(self.complete("muster", "session", "results", "7", "--order=s"),
                         ["--order=submission"])
        # after a flag, the next word is not its value
        self.assertEqual(self.complete("muster", "session", "results", "7", "--follow", "--ord"),
                         ["--order"])

    def test_values_of_the_head(self):
        self.assertEqual(self.complete("muster", "head", "--sync", ""), ["full", "normal"])
        self.assertEqual(self.complete("muster", "head", "--log-level", ""),
                         ["debug", "error", "info", "warn"])
        self.assertEqual(self.complete("muster", "head", "--data-dir", ""), ["models"])
        self.assertEqual(self.complete("muster", "head", "--server-o"), ["--server-only"])

    def test_client_options(self):
        self.assertEqual(self.complete("muster", "queue", "ls", "--u"), ["--url"])
        self.assertEqual(self.complete("muster", "queue", "ls", "--data-dir", ""), ["models"])
        # before the command, as `muster --token T queue ls` takes them
        self.assertEqual(self.complete("muster", "--"),
                         ["--data-dir", "--help", "--token", "--url", "--version"])
        self.assertEqual(self.complete("muster", "--token", "T", "--url", "=", "U", "queue", "l"),
                         ["ls"])
        self.assertEqual(self.complete("muster", "--data-dir", "models", "put", "--fi"),
                         ["--file"])
        # a command that is no client one takes none
        self.assertEqual(self.complete("muster", "iter", "stream", "--ur"), [])

    def test_files_and_commands(self):
        self.assertEqual(self.complete("muster", "put", "--file", ""),
                         ["ckpt.json", "jobs.txt", "models"])
        self.assertEqual(self.complete("muster", "put", "--file", "j"), ["jobs.txt"])
        self.assertEqual(self.complete("muster", "node", "--cache-dir", ""), ["models"])
        self.assertEqual(self.complete("muster", "iter", "restore", "train", "ck"), ["ckpt.json"])
        self.assertIn("ckpt.json", self.complete("muster", "map", "--queue", "q", "<", ""))
        # after --, the worker's command, then its arguments
        self.assertIn("echo", self.complete("muster", "worker", "--queue", "q", "--", "ech"))
        self.assertEqual(self.complete("muster", "worker", "--queue", "q", "--", "cat", "j"),
                         ["jobs.txt"])
        self.assertEqual(self.complete("muster", "worker", "--queue", "q", "--", "cat", "--q"),
                         [])
        # arguments only a head knows get nothing
        self.assertEqual(self.complete("muster", "queue", "rm", ""), [])

    def test_help_and_completion_arguments(self):
        self.assertIn("queue", self.complete("muster", "help", ""))
        self.assertEqual(self.complete("muster", "help", "queue", "r"), ["requeue", "rm"])
        self.assertEqual(self.complete("muster", "completion", ""), ["bash", "zsh"])

    def test_offered_values_are_the_ones_parsed(self):
        with open(self.script) as f:
            arms = re.findall(r'^  "([a-z ]+) --([a-z-]+)"\) echo "([^"]*)" ;;$', f.read(), re.M)
        self.assertTrue(arms)
        for command, option, words in arms:
            self.assertIn(option, PROBES, "no probe for --%s of '%s'" % (option, command))
            self.assertEqual(self.complete(*(["muster"] + command.split() + ["--" + option, ""])),
                             sorted(words.split()), (command, option))
        for option, probe in PROBES.items():
            offered = [a[2].split() for a in arms if a[1] == option]
            self.assertTrue(offered, "--%s is offered no words" % option)
            for word in offered[0] + ["nonesuch"]:
                r = run(*[word if a == "VALUE" else a for a in probe], cwd=self.cwd)
                refused = r.returncode != 0 and ("'%s'" % word in r.stderr or
                                                 "--%s:" % option in r.stderr)
                self.assertEqual(refused, word == "nonesuch", (option, word, r.stderr))
            # and the refusal lists the very words offered, none left out
            self.assertEqual(sorted(offered[0]), expected_words(r.stderr), option)

    def test_an_unknown_shell_is_a_usage_error(self):
        r = run("completion", "fish")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertIn("unknown shell 'fish': expected bash or zsh", r.stderr)
        r = run("completion")
        self.assertEqual(r.returncode, 2)
        self.assertIn("SHELL is missing", r.stderr)
        r = run("completion", "--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("source <(muster completion bash)", r.stdout)
        self.assertIn("/usr/share/bash-completion/completions/muster", r.stdout)

    def test_zsh_runs_the_script_through_bashcompinit(self):
        zsh = harness.ensure_tool("zsh", "zsh")
        home = os.path.join(self.tmp, "home")  # compinit writes its .zcompdump there
        os.makedirs(home, exist_ok=True)
        drive = ('source <("$MUSTER" completion zsh) || exit 9; '
                 'emulate sh -c \'COMP_WORDS=(muster session results 7 --order ""); '
                 'COMP_CWORD=5; _muster; printf "%s\\n" "${COMPREPLY[@]}"\'')
        r = subprocess.run([zsh, "-f", "-c", drive], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, HOME=home, MUSTER=MUSTER), cwd=self.cwd)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertEqual(sorted(r.stdout.split()), ["completion", "submission"])

    def test_the_build_makes_the_installed_script(self):
        built = os.path.join(BUILD, "completion", "muster")
        self.assertTrue(os.path.exists(built), built)
        with open(built) as f, open(self.script) as g:
            self.assertEqual(f.read(), g.read())
        prefix = os.path.join(self.tmp, "prefix")
        install = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix],
                                 capture_output=True, text=True)
        self.assertEqual(install.returncode, 0, install.stdout + install.stderr)
        installed = os.path.join(prefix, "share", "bash-completion", "completions", "muster")
        with open(installed) as f, open(self.script) as g:
            self.assertEqual(f.read(), g.read())


if __name__ == "__main__":
    unittest.main()
