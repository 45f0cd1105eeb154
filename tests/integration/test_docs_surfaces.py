"""The docs of muster's three client surfaces against the code, both ways, as
test_docs_routes.py does for the HTTP routes.

CLI (docs/cli.md against the built binary, MUSTER_BIN): every command `muster --help`
lists has a row in the "Commands" table or a `###` heading, and every option its own
`--help` prints is in its synopsis: the lines `muster COMMAND ...` of the first code
block under a `###` heading (with their indented continuation lines).  The client
options (--url, --token, --data-dir) are the table of "Finding the head", and `-h`,
`--help` the opening paragraph.  The other way, every command the table, a heading or
a synopsis names exists, and so does every option that a `muster COMMAND ...` of
README.md or any docs/*.md gives (synopses, examples, inline code): the command's
`--help` names it, but for the few that a doc gives on purpose to quote their refusal
(REFUSED_IN_DOCS).  Every `--help` exits 0 and starts with its usage line.  `muster head --help`,
text written apart from the options it parses (every other command's is printed from
the table it is parsed with), lists exactly the options the source takes.

C library (docs/client.md against include/muster.h, the one public header; CMake
installs none, and the README points C users to client.md): every function, type,
enum constant and macro of the header has a row in a table of client.md (its name in
the first cell), the error codes in their order with the wire string, HTTP status and
message of MUSTER_ERRNO_MAP; every `muster_*` and `MUSTER_*` name client.md mentions is in the
header, and every `muster_x_t.field` it names is a field of that struct.

Python (docs/python.md against python/muster): every name of `muster.__all__` is in a
code span; every public method of Client is in the Client table and every name that
table gives exists (`shared.x` on Shared, `lease.x` on Lease, `.x` on LeaseList);
every public method of the other classes (Lease, Pool, the samplers, the iteration
classes, the errors' attributes, ...) is in the row of its class in the "Reference"
table, and every name there exists; the "Errors" table maps each wire code to the
class the client raises for it; and every `Client.x`, `Pool.x`, ... the doc writes
exists.  Classes are read from the source (ast), so muster.torch needs no torch.

MUSTER_DOCS_TEST_DOCS, _README, _INCLUDE, _PYTHON and _SRC point the test at edited copies (to
see it fail).  Names deliberately left out are listed below (C_NOT_API, PY_NOT_API,
PY_CODES_NOT_RAISED), each with its reason.
"""
import ast
import fnmatch
import glob
import keyword
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
DOCS = os.environ.get("MUSTER_DOCS_TEST_DOCS", os.path.join(ROOT, "docs"))
INCLUDE = os.environ.get("MUSTER_DOCS_TEST_INCLUDE", os.path.join(ROOT, "include"))
PYTHON = os.environ.get("MUSTER_DOCS_TEST_PYTHON", os.path.join(ROOT, "python"))
SRC = os.environ.get("MUSTER_DOCS_TEST_SRC", os.path.join(ROOT, "src"))
README = os.environ.get("MUSTER_DOCS_TEST_README", os.path.join(ROOT, "README.md"))
MUSTER = harness.MUSTER_BIN


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def doc(name):
    """docs/NAME, or the repository's README.md for "README.md"."""
    return read(README if name == "README.md" else os.path.join(DOCS, name))


# ---- Markdown, as our docs write it ----------------------------------------------------

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# A code span, which may go on over one line break (a paragraph's line).
CODE_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")


def outside_fences(text):
    """`text` with its fenced blocks blanked (so that code spans are prose's only)."""
    return FENCE.sub("", text)


def code_spans(text):
    return [" ".join(span.split()) for span in CODE_SPAN.findall(outside_fences(text))]


def cells(row):
    """The cells of table row `row` (`| a | b |`); an escaped `\\|` stays in its cell."""
    parts = re.split(r"(?<!\\)\|", row.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def table_rows(lines):
    """The cells of every row of every table in `lines`, header and rule left out."""
    rows, previous = [], ""
    for line in lines:
        if line.startswith("|") and not re.match(r"^\|[\s|:-]+\|$", line):
            if not previous.startswith("|"):  # a header row: the rule follows it
                previous = line
                continue
            rows.append(cells(line))
        previous = line
    return rows


def headings(text):
    """(level, title, lines under it up to the next heading) of each heading of `text`;
    a line inside a fenced block is no heading."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+) (.*)", line)
        if heading:
            found.append((len(heading.group(1)), heading.group(2).strip(), []))
        elif found:
            found[-1][2].append(line)
    return found


def sections(text, level):
    """(title, lines) of each heading of `level` (2 for `##`), with the headings below
    it and their lines."""
    found = []
    for depth, title, lines in headings(text):
        if depth == level:
            found.append((title, list(lines)))
        elif depth > level and found:
            found[-1][1].extend(["#" * depth + " " + title] + lines)
        elif depth < level and found:
            found.append((None, []))  # ends the section above
    return [(title, lines) for title, lines in found if title is not None]


def section(text, title):
    """The lines under the one heading `title`, its subsections included."""
    levels = [depth for depth, t, _ in headings(text) if t == title]
    assert len(levels) == 1, "no single heading %r" % title
    return dict(sections(text, levels[0]))[title]


# ---- the CLI ------------------------------------------------------------------------------

OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# The lines of a help's option lists: "  --name ARG   text" or "  -h, --help   text".
HELP_ITEM = re.compile(r"^  (?:-([a-zA-Z]), )?(--[a-z][a-z0-9-]*)")
# Documented everywhere (cli.md's first paragraph), so no synopsis repeats them.
HELP_OPTIONS = {"-h", "--help"}


def run(words):
    return subprocess.run([MUSTER] + list(words) + ["--help"], capture_output=True, text=True,
                          timeout=30)


class Help:
    """What `muster WORDS --help` prints: exit status, usage line, and the options of
    each list: `own` (options: and the head's local node agent's), `client` (client
    options:), both without -h/--help."""

    def __init__(self, words):
        reply = run(words)
        self.returncode, self.text, self.stderr = reply.returncode, reply.stdout, reply.stderr
        self.usage = self.text.splitlines()[0] if self.text else ""
        self.own, self.client, self.help = set(), set(), set()
        into = None
        for line in self.text.splitlines():
            if re.match(r"^(options|local node agent .*):$", line):
                into = self.own
            elif line == "client options:":
                into = self.client
            elif not line.strip() or not line.startswith(" "):
                into = None
            elif into is not None:
                item = HELP_ITEM.match(line)
                if item:
                    names = {item.group(2)} | ({"-" + item.group(1)} if item.group(1) else set())
                    (self.help if names & HELP_OPTIONS else into).update(names)

    @property
    def options(self):
        return self.own | self.client | self.help


_HELPS = {}


def help_of(words):
    key = tuple(words)
    if key not in _HELPS:
        _HELPS[key] = Help(key)
    return _HELPS[key]


def head_taken_options():
    """The options `muster head` takes, read from the source: the head's getopt table
    (src/server/head_options.c, head_options[]) and the local agent's options it passes
    on (src/cli/cmd_node.c, head_agent_valued and head_agent_flags).  Its --help is
    text written beside them, unlike the other commands', which is printed from the
    table each command is parsed with (src/cli/args.c)."""
    table = re.search(r"struct option head_options\[\] = \{(.*?)\n\};",
                      read(os.path.join(SRC, "server", "head_options.c")), re.S)
    assert table, "no head_options[] in src/server/head_options.c"
    names = set(re.findall(r'\{"([a-z-]+)",', table.group(1)))
    node = read(os.path.join(SRC, "cli", "cmd_node.c"))
    for array in ("head_agent_valued", "head_agent_flags"):
        listed = re.search(r"\b%s\[\] = \{(.*?)\};" % array, node, re.S)
        assert listed, "no %s[] in src/cli/cmd_node.c" % array
        names |= set(re.findall(r'"([a-z-]+)"', listed.group(1)))
    assert {"listen", "help", "queue", "server-only"} <= names, names
    return {"--" + n for n in names}


def cli_commands():
    """Every command and subcommand `muster --help` lists, as tuples of words."""
    reply = subprocess.run([MUSTER, "--help"], capture_output=True, text=True, timeout=30)
    assert reply.returncode == 0, reply.stderr
    listing = reply.stdout.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0]
    names = [tuple(m.split()) for m in re.findall(r"^  ([a-z]+(?: [a-z]+)?)  ", listing, re.M)]
    assert ("iter", "create") in names and ("head",) in names, names
    return names


def cli_groups(commands):
    return sorted({c[:1] for c in commands if len(c) == 2})


def command_names(cell):
    """The commands a cell of cli.md names: each code span of lower-case words, one
    command or a group's subcommand (`queue create`), or several
    (`session create|ls|put`)."""
    names = []
    for span in CODE_SPAN.findall(cell):
        words = span.split()
        if not words or not re.match(r"^[a-z|]+$", "".join(words[:2])):
            continue
        if len(words) == 1:
            names.append((words[0],))
        else:
            names += [(words[0], sub) for sub in words[1].split("|")]
    return names


def cli_documented_commands(commands):
    """(name, where) of every command cli.md names in its Commands table (first cells)
    and in the headings under it."""
    commands_section = section(doc("cli.md"), "Commands")
    found = []
    for row in table_rows(commands_section):
        found += [(name, "the Commands table") for name in command_names(row[0])]
    for heading, _ in sections("\n".join(commands_section), 3):
        found += [(tuple(w.split()), "heading '### %s'" % heading)
                  for w in heading.split(", ")]
    return found


def logical_lines(block):
    """The lines of a code block with their continuations joined: a line ending in `\\`,
    and a synopsis's next line (indented, then `[`, `(` or `-`)."""
    joined = []
    for line in block.splitlines():
        if joined and (joined[-1].endswith("\\") or re.match(r"^ +[\[(-]", line)):
            joined[-1] = joined[-1].rstrip("\\") + " " + line.strip()
        else:
            joined.append(line)
    return joined


def synopses(commands, raw=False):
    """{command: [synopsis lines]}: the `muster COMMAND ...` lines of the first code
    block under each `###` heading of cli.md (what follows the command, or with `raw`
    the whole line)."""
    found = {}
    for heading, lines in sections(doc("cli.md"), 3):
        body = "\n".join(lines).strip("\n")
        block = re.match(r"```\w*\n(.*?)^```", body, re.S | re.M)
        if not block:
            continue
        for line in logical_lines(block.group(1)):
            command = invoked(line, commands)
            if command:
                found.setdefault(command[0], []).append(line if raw else command[1])
    return found


# Where the options given to a command end in an example: its payload or command after
# `--`, a pipe, a comment, a redirection, the end of a $(...) or of a shell statement.
INVOCATION_END = re.compile(r" -- | \| |\s#|[;)&<>]| \\$")


def invoked(line, commands):
    """(command, the rest of the line) when `line` runs `muster COMMAND`; the command is
    None when `muster` is followed by a lower-case word that is no command."""
    m = re.search(r"(?:^|[\s($|])muster ((?:[a-z][a-z-]* ?)+)(.*)", line.strip().lstrip("$ "))
    if not m:
        return None
    words = m.group(1).split()
    for size in (2, 1):
        if tuple(words[:size]) in commands or (size == 1 and (words[0],) in cli_groups(commands)):
            rest = " ".join(words[size:]) + " " + m.group(2)
            return tuple(words[:size]), rest
    return (None, " ".join(words))


# Options a doc gives a command to say that it refuses them, by doc and command.
REFUSED_IN_DOCS = {
    ("coming-from.md", ("node",)): {"--head"},   # "muster node --head ... says what to write"
}


def doc_names():
    """The docs whose `muster` lines are checked: README.md and every docs/*.md."""
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(DOCS, "*.md")))
    assert {"cli.md", "pools.md", "node.md"} <= set(names), names
    return ["README.md"] + names


def example_invocations(commands):
    """(where, command, options given) of every `muster COMMAND ...` of README.md and
    docs/*.md: code blocks (synopses and examples) and inline code.  An example's options
    end where INVOCATION_END says; a synopsis's are all of its line.  A quoted message
    (`muster head: ...`: the command followed by a colon) runs nothing."""
    whole = {line.strip() for lines in synopses(commands, raw=True).values() for line in lines}
    found = []
    for name in doc_names():
        text = doc(name)
        # A shell comment runs nothing ("# ... as muster reads them").
        pieces = [re.sub(r"(^|\s)#\s.*$", "", line) for _, block in FENCE.findall(text)
                  for line in logical_lines(block)]
        pieces += [span for span in code_spans(text) if span.startswith("muster ")]
        for piece in pieces:
            command = invoked(piece, commands)
            if command and command[0] and command[1].lstrip().startswith(":"):
                continue
            if command:
                given = command[1] if piece.strip() in whole else \
                    INVOCATION_END.split(command[1] + " ")[0]
                found.append(("%s: %s" % (name, piece.strip()), command[0],
                              set(OPTION.findall(given))))
    return found


class Cli(unittest.TestCase):
    """docs/cli.md against `muster ... --help`."""

    @classmethod
    def setUpClass(cls):
        cls.commands = cli_commands()

    def test_every_help_exits_0_with_its_usage(self):
        for words in self.commands + cli_groups(self.commands):
            with self.subTest(command=" ".join(words)):
                help = help_of(words)
                self.assertEqual(help.returncode, 0, help.stderr)
                self.assertTrue(help.usage.startswith("usage: muster %s" % " ".join(words)),
                                help.usage)
                if words in self.commands:
                    self.assertEqual(help.help, HELP_OPTIONS, "-h, --help not listed")

    def test_every_command_is_documented(self):
        documented = {name for name, _ in cli_documented_commands(self.commands)}
        missing = [" ".join(c) for c in self.commands if c not in documented]
        self.assertEqual(missing, [], "commands with no row in docs/cli.md's Commands table "
                         "nor a ### heading")

    def test_every_documented_command_exists(self):
        known = set(self.commands) | set(cli_groups(self.commands))
        unknown = ["%s (%s)" % (" ".join(name), where)
                   for name, where in cli_documented_commands(self.commands) if name not in known]
        self.assertEqual(unknown, [], "docs/cli.md names commands `muster --help` does not list")

    def test_every_option_is_in_the_synopsis(self):
        found = synopses(self.commands)
        for words in self.commands:
            own = help_of(words).own
            text = " ".join(found.get(words, []))
            missing = sorted(o for o in own if o not in set(OPTION.findall(text)))
            with self.subTest(command=" ".join(words)):
                self.assertEqual(missing, [], "options of `muster %s --help` missing from its "
                                 "synopsis in docs/cli.md (the code block under its ### "
                                 "heading)" % " ".join(words))
        self.assertIn(("worker",), found)
        self.assertIn(("iter", "create"), found)

    def test_client_options_are_the_finding_the_head_table(self):
        table = {o for row in table_rows(section(doc("cli.md"), "Finding the head"))
                 for o in OPTION.findall(row[0])}
        given = set().union(*(help_of(words).client for words in self.commands))
        self.assertEqual(table, given, "docs/cli.md 'Finding the head' against the client "
                         "options of the commands' --help")
        intro = doc("cli.md").split("\n## ", 1)[0]
        self.assertIn("`--help` (or `-h`)", intro)

    def test_head_help_lists_every_option_it_takes(self):
        help = help_of(("head",))
        self.assertEqual(help.own | (help.help - {"-h"}), head_taken_options(),
                         "`muster head --help` against the options it takes")

    def test_every_documented_option_exists(self):
        wrong, seen = [], set()
        for where, command, given in example_invocations(self.commands):
            if command is None:
                wrong.append("%s: no such command" % where)
                continue
            seen.add(command)
            unknown = sorted(given - help_of(command).options
                             - REFUSED_IN_DOCS.get((where.split(":")[0], command), set()))
            if unknown:
                wrong.append("%s: %s" % (where, ", ".join(unknown)))
        self.assertEqual(wrong, [], "options README.md or docs/*.md give a command that its "
                         "--help does not list")
        self.assertIn(("map",), seen)


# ---- the C library ------------------------------------------------------------------------

C_NAME = re.compile(r"\b((?:muster|MUSTER)_\w+)\b")

# Names in include/muster.h that are not API, and why.
C_NOT_API = {
    "MUSTER_H": "the header's include guard",
    "MUSTER_ERR_ENUM": "a helper of the muster_err_t enum, #undef'd right after it",
}


def strip_c_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def header_text():
    paths = sorted(glob.glob(os.path.join(INCLUDE, "*.h")))
    assert paths, "no header under " + INCLUDE
    return "\n".join(strip_c_comments(read(p)) for p in paths)


def error_table():
    """{MUSTER_NAME: (wire string, HTTP status, default message)} of MUSTER_ERRNO_MAP."""
    rows = re.findall(r'XX\((\w+),\s*"([^"]*)",\s*(\d+),[\s\\]*"([^"]*)"\)', header_text())
    assert len(rows) > 20, "MUSTER_ERRNO_MAP was not read"
    return {"MUSTER_" + name: (wire, int(status), message)
            for name, wire, status, message in rows}


def header_names():
    """Every public name of the headers: functions, types, enum constants (those of
    MUSTER_ERRNO_MAP too) and macros; a struct tag (`struct muster_client`) is not one."""
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', header_text())  # strings name nothing
    written = set(C_NAME.findall(code))
    tags = {n for n in written if not re.search(r"(?<!struct )\b%s\b" % n, code)}
    return (written - tags - set(C_NOT_API)) | set(error_table())


def struct_fields(code, type_name):
    body = re.search(r"typedef struct \{(.*?)\}\s*%s;" % type_name, code, re.S)
    if not body:
        return None
    return set(re.findall(r"(\w+)\s*(?:\[\d*\])?\s*[;,]", body.group(1))) | set(
        re.findall(r"\(\*(\w+)\)", body.group(1)))


def client_documented():
    """{name: row} of every name at the start of a code span in a first cell of a table
    of client.md (`muster_x(args)` names muster_x)."""
    found = {}
    for row in table_rows(doc("client.md").splitlines()):
        for span in CODE_SPAN.findall(row[0]):
            m = re.match(r"\s*((?:muster|MUSTER)_\w+)", span)
            if m:
                found[m.group(1)] = row
    return found


class Schema(unittest.TestCase):
    """Where the docs name the current schema of a data dir (`muster version`, `muster
    status`, GET /v1/health, the upgrade's log line), it is this binary's: a migration
    added without the docs following fails here."""

    def test_the_schema_the_docs_name_is_the_binarys(self):
        out = subprocess.run([MUSTER, "version"], capture_output=True, text=True, check=True)
        current = int(re.search(r"\(data dir schema (\d+)\)", out.stdout).group(1))
        said = re.compile(r"\(schema (\d+)\)|data dir schema (\d+)|\"schema\": (\d+)|"
                          r"migrated the schema from version \d+ to (\d+)|"
                          r"from schema \d+ to (\d+)")
        found = [(name, int(next(g for g in m.groups() if g)))
                 for name in doc_names() for m in said.finditer(doc(name))]
        self.assertGreaterEqual(len(found), 5, found)
        self.assertEqual([f for f in found if f[1] != current], [],
                         "the docs name a schema other than this binary's %d" % current)


class CLibrary(unittest.TestCase):
    """docs/client.md against include/muster.h."""

    def test_every_public_name_is_documented(self):
        documented = client_documented()
        missing = sorted(header_names() - set(documented))
        self.assertEqual(missing, [], "names of include/muster.h with no row in a table of "
                         "docs/client.md (the name in its first cell)")
        self.assertGreater(len(documented), 100)

    def test_error_codes_carry_their_wire_string_and_status(self):
        documented = client_documented()
        codes = [name for row in table_rows(doc("client.md").splitlines())
                 for name in re.findall(r"^`(MUSTER_\w+)`$", row[0]) if name in error_table()]
        self.assertEqual(codes, list(error_table()), "the codes' rows, in the header's order")
        for name, (wire, status, message) in sorted(error_table().items()):
            row = documented.get(name)
            with self.subTest(code=name):
                self.assertIsNotNone(row, "no row")
                self.assertEqual(row[1:], ["`%s`" % wire, str(status) if status else "-",
                                           message],
                                 "wire string, HTTP status (- for none), default message")

    def test_every_name_the_doc_mentions_exists(self):
        text = doc("client.md")
        unknown = sorted(set(C_NAME.findall(text)) - header_names())
        self.assertEqual(unknown, [], "docs/client.md names what include/muster.h does not "
                         "declare")
        code = header_text()
        wrong = []
        for type_name, field in sorted(set(re.findall(r"\b(muster_\w+_t)\.(\w+)", text))):
            fields = struct_fields(code, type_name)
            if fields is None or field not in fields:
                wrong.append("%s.%s" % (type_name, field))
        self.assertEqual(wrong, [], "docs/client.md names struct fields the header lacks")


class CBuild(unittest.TestCase):
    """docs/client.md's "Building a program", run as a C user runs it: its `cc` line in a
    directory laid out as the repository (`include/`, `build/` the build under test),
    then its program against a head (the URL adapted to the test head's port)."""

    def test_the_first_program_builds_and_runs(self):
        blocks = FENCE.findall("\n".join(section(doc("client.md"), "Building a program")))
        self.assertEqual([lang for lang, _ in blocks], ["sh", "sh", "c"])
        (_, installed), (_, build), (_, program) = blocks   # the install: test_c_build
        self.assertIn("prog.c", build)
        work = tempfile.mkdtemp(prefix="muster-docs-cbuild-")
        self.addCleanup(shutil.rmtree, work, True)
        os.symlink(INCLUDE, os.path.join(work, "include"))
        os.symlink(os.path.abspath(os.environ.get("MUSTER_BUILD_DIR")
                                   or os.path.dirname(MUSTER)), os.path.join(work, "build"))
        head = harness.Head().start()
        self.addCleanup(head.cleanup)
        self.assertIn('"http://127.0.0.1:7370"', program)
        with open(os.path.join(work, "prog.c"), "w") as f:
            f.write(program.replace("http://127.0.0.1:7370", head.url))
        # A sanitizer build's libmuster wants its runtime loaded first (test_c_build).
        import test_c_build
        flags = " ".join(test_c_build.sanitized())
        r = subprocess.run(["bash", "-e", "-u", "-c", build.replace("cc ", "cc %s " % flags, 1)
                            if flags else build], cwd=work, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, "the cc line of client.md:\n" + r.stderr)
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        r = subprocess.run([os.path.join(work, "prog")], cwd="/", env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "ok: \n", ""))


# ---- Python -------------------------------------------------------------------------------

# Public members that are not API, and why.
PY_NOT_API = {
    ("IndexGap", "from_reply"): "the client's and the pool's constructor of the error",
    ("IndexCollision", "from_refusal"): "the pool's constructor of the error",
}
# Codes of MUSTER_ERRNO_MAP that the Python client raises no error class for, and why.
PY_CODES_NOT_RAISED = {
    "ok": "success, not an error",
    "out_of_memory": "libmuster's own; Python raises MemoryError",
    "io_error": "libmuster's own (a local file failed); Python raises OSError",
}
# The classes of the Reference table of docs/python.md, and the module of each; the
# exported classes are added from __all__.
PY_MORE_CLASSES = {"Dataset": "iteration", "Plan": "iteration", "Stream": "iteration",
                   "Loader": "loader", "RankSampler": "sampling",
                   "DistributedSampler": "torch", "StreamDataset": "torch"}


def py_package():
    """muster's __init__: (__all__, {exported name: module it comes from})."""
    tree = ast.parse(read(os.path.join(PYTHON, "muster", "__init__.py")))
    exported, where = None, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "__all__":
            exported = ast.literal_eval(node.value)
        elif isinstance(node, ast.Assign) and node.targets[0].id == "_LAZY":
            for module, names in ast.literal_eval(node.value).items():
                where.update((n, module) for n in names)
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            where.update((a.name, node.module) for a in node.names)
    assert exported, "muster/__init__.py has no __all__"
    return exported, where


def py_classes(module):
    """{class name: ast.ClassDef} of muster/MODULE.py."""
    tree = ast.parse(read(os.path.join(PYTHON, "muster", module + ".py")))
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def py_members(node, exception):
    """(the public members of a class that its docs must name, the attributes they may
    name too): methods and properties, aliases (`terminate = close`) and class
    attributes; and the attributes its __init__ sets, which an exception's docs must
    name (they are what it carries), another class's may."""
    members, attributes = set(), set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            if not item.name.startswith("_"):
                members.add(item.name)
            elif item.name == "__init__":
                attributes |= {t.attr for t in ast.walk(item) if isinstance(t, ast.Attribute) and
                               isinstance(t.ctx, ast.Store) and isinstance(t.value, ast.Name) and
                               t.value.id == "self" and not t.attr.startswith("_")}
        elif isinstance(item, ast.Assign) and isinstance(item.value,
                                                         (ast.Name, ast.Constant, ast.Tuple)):
            for target in item.targets:
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    members.add(target.id)
    members.discard("default_code")  # the code it is raised with: the Errors table's
    if exception:
        return members | attributes, set()
    return members, attributes


def py_error_names():
    return set(py_classes("errors"))


def py_error_codes():
    """{wire code: the class name the client raises for it} of muster/errors.py's
    _BY_CODE."""
    tree = ast.parse(read(os.path.join(PYTHON, "muster", "errors.py")))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_BY_CODE":
            return {k.value: v.id for k, v in zip(node.value.keys, node.value.values)}
    raise AssertionError("no _BY_CODE in muster/errors.py")


def py_api():
    """{class: (module, members its docs must name, attributes they may name)} of the
    exported classes and PY_MORE_CLASSES."""
    exported, where = py_package()
    errors = py_error_names()
    api = {}
    for name in [n for n in exported if n[:1].isupper()] + list(PY_MORE_CLASSES):
        module = where.get(name) or PY_MORE_CLASSES[name]
        node = py_classes(module).get(name)
        assert node is not None, "%s is not a class of muster/%s.py" % (name, module)
        exception = name in errors or any(  # a base `MusterError` or `errors.InvalidState`
            getattr(b, "id", getattr(b, "attr", "")) in errors for b in node.bases)
        members, attributes = py_members(node, exception)
        api[name] = (module, members - {m for c, m in PY_NOT_API if c == name}, attributes)
    return api


def client_table():
    """The code spans of the methods column of docs/python.md's Client table."""
    rows = [row for row in table_rows(section(doc("python.md"), "Client"))
            if len(row) == 2 and not row[0].startswith("`")]
    assert len(rows) > 8, "the Client table of docs/python.md was not read"
    return [span for row in rows for span in CODE_SPAN.findall(row[1])]


def table_name(span):
    """(receiver, name) of a code span of the Client table: `put(queue, ...)` and
    `put_queue` are ("", name), `shared.get(...)` ("shared", "get"), `.updates`
    (".", "updates"), `*_many` ("", "*_many"); None for the rest (a keyword argument
    with its value, a dict, a class)."""
    m = re.match(r"^(?:(\w*)\.)?([\w*]+)(?:\(.*)?$", span)
    if not m or span[:1].isupper():
        return None
    receiver = "" if m.group(1) is None else m.group(1) or "."
    return receiver, m.group(2)


def py_parameters(node):
    """The names of the parameters of a class's methods."""
    return {a.arg for f in node.body if isinstance(f, ast.FunctionDef)
            for a in f.args.args + f.args.kwonlyargs}


# A member in a cell of the Reference table: `name`, `.name` or `name(arguments)`; other
# spans (`None`, `Client`) are prose's.
MEMBER_SPAN = re.compile(r"^\.?([a-z_]\w*)(?:\(.*\))?$")


def reference_table():
    """{class: set of names} of the Reference table of docs/python.md: the classes of
    the first cell (`Pool`, `muster.iteration.Plan`), the members of the second."""
    found = {}
    for row in table_rows(section(doc("python.md"), "Reference")):
        classes = [s.split(".")[-1] for s in CODE_SPAN.findall(row[0])]
        names = {m.group(1) for m in map(MEMBER_SPAN.match, CODE_SPAN.findall(row[1]))
                 if m and not keyword.iskeyword(m.group(1))}  # `with` is no member
        for name in classes:
            if name[:1].isupper():
                found[name] = names
    return found


class Python(unittest.TestCase):
    """docs/python.md against python/muster."""

    @classmethod
    def setUpClass(cls):
        cls.api = py_api()

    def test_every_export_is_mentioned(self):
        exported, _ = py_package()
        mentioned = {w for s in code_spans(doc("python.md")) + [
            b for _, b in FENCE.findall(doc("python.md"))] for w in re.findall(r"\w+", s)}
        self.assertEqual([n for n in exported if n not in mentioned], [],
                         "names of muster.__all__ no code in docs/python.md mentions")

    def test_client_table_both_ways(self):
        """A bare name of the table is a method of Client or, as in "with
        `updates_after`", one of their parameters; `shared.x` is Shared's, `lease.x`
        Lease's, `.x` LeaseList's (`counts.ready`, a reply's field, is not checked)."""
        module, members, _ = self.api["Client"]
        spans = [name for name in map(table_name, client_table()) if name]
        plain = [n for r, n in spans if r == ""]
        missing = sorted(m for m in members
                         if not any(fnmatch.fnmatchcase(m, p) for p in plain))
        self.assertEqual(missing, [], "public methods of Client missing from the Client table "
                         "of docs/python.md")
        parameters = py_parameters(py_classes(module)["Client"])
        on = {"": members | parameters, "shared": self.api["Shared"][1],
              "lease": self.api["Lease"][1], ".": self.api["LeaseList"][1]}
        wrong = sorted("%s%s" % (r + "." if r not in ("", ".") else r, n) for r, n in spans
                       if r in on and not any(fnmatch.fnmatchcase(m, n) for m in on[r]))
        self.assertEqual(wrong, [], "names in the Client table of docs/python.md that the "
                         "client does not have")

    def test_reference_table_both_ways(self):
        table = reference_table()
        for name, (module, members, attributes) in sorted(self.api.items()):
            if name == "Client":
                continue
            with self.subTest(cls=name):
                if not members:
                    self.assertNotIn(name, table, "a class with no public member has no row")
                    continue
                self.assertIn(name, table, "no row in the Reference table of docs/python.md")
                self.assertEqual(sorted(members - table[name]), [],
                                 "public members missing from its row")
                self.assertEqual(sorted(table[name] - members - attributes), [],
                                 "names in its row that muster/%s.py's %s lacks"
                                 % (module, name))
        self.assertEqual(sorted(set(table) - set(self.api)), [],
                         "rows of classes this test does not know")

    def test_errors_table_maps_each_code_to_its_class(self):
        by_code = py_error_codes()
        rows = table_rows(section(doc("python.md"), "Errors"))
        named = {}
        for row in rows:
            classes = [s for s in CODE_SPAN.findall(row[0]) if s[:1].isupper()]
            for pattern in [s for s in CODE_SPAN.findall(row[1]) if re.match(r"^[a-z_*]+$", s)]:
                codes = fnmatch.filter(by_code, pattern)
                self.assertTrue(codes, "%s: no such code" % pattern)
                for code in codes:
                    named.setdefault(code, set()).update(classes)
        for code, cls in sorted(by_code.items()):
            with self.subTest(code=code):
                self.assertIn(cls, named.get(code, ()), "the Errors table of "
                              "docs/python.md against muster.errors._BY_CODE")
        self.assertEqual(sorted(set(by_code) ^ {w for w, _, _ in error_table().values()} -
                                set(PY_CODES_NOT_RAISED)), [],
                         "the client's codes against MUSTER_ERRNO_MAP")

    def test_every_qualified_name_exists(self):
        text = doc("python.md")
        wrong = []
        for cls, name in sorted(set(re.findall(r"\b([A-Z]\w+)\.([a-z_]\w*)", text))):
            if cls in self.api and name not in self.api[cls][1] | self.api[cls][2]:
                wrong.append("%s.%s" % (cls, name))
        self.assertEqual(wrong, [], "docs/python.md names methods the classes do not have")


if __name__ == "__main__":
    unittest.main()
