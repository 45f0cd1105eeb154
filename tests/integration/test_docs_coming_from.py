"""docs/coming-from.md, run: the guide for users of the five tools muster replaces.

Each `## Coming from ...` section holds one example, marked so that nothing else can be
taken for it:

    <!-- example: NAME -->        the next line opens a ```python or ```sh block: the example
    <!-- output: NAME -->         the next line opens a ``` block: what it prints, exactly
    <!-- node: NAME -->           (optional, before the example) a ```sh block of one
                                  `muster node ...` command: a node agent it needs

For a section, this test starts a head on a free port, runs the section's node blocks in
bash as they are written (a shell function `muster` adds the options that keep a test's
agent apart from the machine's: --name, --listen 127.0.0.1:0, --lock-file, --state-dir,
--cache-dir), waits until each agent listens, and runs the example (python blocks with
/usr/bin/python3, sh blocks with bash -e -u -o pipefail) with MUSTER_URL and
MUSTER_TOKEN naming the head, NODE_URL the first agent's API, `muster` on PATH and the
package of python/ on PYTHONPATH.  Its standard output must equal the output block, and
it must exit 0.

It also checks that every section of the five tools is there with its example, and that
what the sections' tables name in their last (muster's) column exists: a `muster ...`
command answers `muster help ...` and has every option given; a `METHOD /path` is an
endpoint of docs/api.md (test_docs_routes.py checks that file against the code); a
`muster_*` C name is declared in include/muster.h; a `strategy="..."` or
`shuffle="..."` is one of muster.iteration's; a Python name resolves, where
`client`, `client.shared`, `worker`, `pool` and `stream` stand for instances of
muster.Client, muster.Shared, muster.WorkerClient, muster.Pool and
muster.iteration.Stream (the guide says so).
"""
import ast
import importlib
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
import test_docs_routes  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# Read from the environment so that a check of this test can point it at an edited copy.
GUIDE = os.environ.get("MUSTER_COMING_FROM_DOC", os.path.join(ROOT, "docs", "coming-from.md"))
PYTHON_DIR = os.path.join(ROOT, "python")
PY = "/usr/bin/python3"

# The section of each tool: a word its heading must hold.
TOOLS = ("Lavender Data", "tenflowers", "DistCompute", "ALPCRUN.CH", "distributed_computing")
MARKER = re.compile(r"^<!-- (example|output|node): ([a-z0-9-]+) -->$")
FENCE_OPEN = re.compile(r"^```([a-z]*)$")
EXAMPLE_TIMEOUT_S = 120
NODE_START_S = 30

# The shell function a node block runs under: the agent's name, API port, lock, state
# and cache are the test's, so that it meets no agent of this machine (nor another
# test's); everything the block says passes as written.
NODE_SHIM = r'''muster() {
  if [ "$1" = node ]; then
    shift
    exec "$MUSTER_BIN" node --name "$DOCS_NODE_NAME" --listen 127.0.0.1:0 \
      --lock-file "$DOCS_NODE_DIR/lock" --state-dir "$DOCS_NODE_DIR/state" \
      --cache-dir "$DOCS_NODE_DIR/cache" "$@"
  fi
  "$MUSTER_BIN" "$@"
}
'''


class Block:
    def __init__(self, kind, name, lang, code, line):
        self.kind, self.name, self.lang, self.code, self.line = kind, name, lang, code, line


class Section:
    def __init__(self, title, line):
        self.title, self.line = title, line
        self.blocks = []
        self.table_cells = []   # the last cell of each row of its tables

    def marked(self, kind):
        return [b for b in self.blocks if b.kind == kind]


def parse(text):
    """The `## ` sections of the guide, each with its marked blocks and table cells.
    Raises AssertionError for a marker not followed by a fenced block, or a block
    not closed: the examples must be found without guessing."""
    sections, current = [], None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            current = Section(line[3:].strip(), i + 1)
            sections.append(current)
        elif line.startswith("|") and current is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("- :"):
                current.table_cells.append((i + 1, cells[-1]))
        marker = MARKER.match(line)
        if marker:
            assert current is not None, "line %d: a marker before any section" % (i + 1)
            fence = FENCE_OPEN.match(lines[i + 1]) if i + 1 < len(lines) else None
            assert fence, "line %d: %s is not followed by a ``` block" % (i + 1, line)
            end = i + 2
            while end < len(lines) and lines[end] != "```":
                end += 1
            assert end < len(lines), "line %d: the block after %s is not closed" % (i + 2, line)
            current.blocks.append(Block(marker.group(1), marker.group(2), fence.group(1),
                                        "\n".join(lines[i + 2:end]) + "\n", i + 1))
            i = end
        i += 1
    return sections


def read_guide():
    with open(GUIDE, encoding="utf-8") as f:
        return f.read()


def tool_sections(sections):
    """{tool: its section}; fails unless each tool has exactly one section."""
    found = {}
    for tool in TOOLS:
        matching = [s for s in sections if s.title.startswith("Coming from") and tool in s.title]
        assert len(matching) == 1, "%d sections for %s in %s" % (len(matching), tool, GUIDE)
        found[tool] = matching[0]
    return found


class GuideShape(unittest.TestCase):
    def test_every_section_has_its_example_and_output(self):
        sections = parse(read_guide())
        names = [b.kind + ":" + b.name for s in sections for b in s.blocks]
        self.assertEqual(len(names), len(set(names)), "a marker name is used twice")
        for tool, section in tool_sections(sections).items():
            with self.subTest(tool=tool):
                examples = section.marked("example")
                self.assertEqual(len(examples), 1, "%s: one example" % section.title)
                example = examples[0]
                self.assertIn(example.lang, ("python", "sh"), section.title)
                self.assertEqual([b.name for b in section.marked("output")], [example.name],
                                 "%s: one output block, named as its example" % section.title)
                for node in section.marked("node"):
                    self.assertEqual(node.lang, "sh", node.name)
                    self.assertLess(node.line, example.line,
                                    "%s comes after the example" % node.name)
                    self.assertTrue(shlex.split(node.code)[:2] == ["muster", "node"],
                                    "%s: one `muster node` command" % node.name)
                self.assertTrue(section.table_cells, "%s: no table" % section.title)

    def test_a_marker_must_open_a_block(self):
        # Bad input: the parser refuses what it would otherwise have to guess.
        with self.assertRaises(AssertionError):
            parse("## Coming from x\n<!-- example: a -->\n\n```python\nprint(1)\n```\n")
        with self.assertRaises(AssertionError):
            parse("## Coming from x\n<!-- example: a -->\n```python\nprint(1)\n")
        self.assertEqual(parse("## Coming from x\n<!-- example: a -->\n```sh\ntrue\n```\n")[0]
                         .blocks[0].code, "true\n")


# ---- the tables ---------------------------------------------------------------------

SPAN = re.compile(r"`([^`]+)`")
HTTP = re.compile(r"^(GET|HEAD|PUT|POST|DELETE) (/\S*)")
INSTANCES = {"client": ("muster", "Client"), "client.shared": ("muster", "Shared"),
             "worker": ("muster", "WorkerClient"), "pool": ("muster", "Pool"),
             "stream": ("muster.iteration", "Stream")}
PY_NAME = re.compile(r"^([A-Za-z_][\w.]*)(\(|$)")


def cli_words(argv):
    """The command words of `muster ...` (those before the first option or argument)."""
    words = []
    for word in argv[1:]:
        if not re.fullmatch(r"[a-z]+", word) or len(words) == 2:
            break
        words.append(word)
    return words


def py_source_defines(module, name):
    """Whether python/muster/MODULE.py defines `name` at its top level (for a module
    this interpreter cannot import: muster.torch without torch)."""
    path = os.path.join(PYTHON_DIR, *module.split(".")) + ".py"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return any(getattr(node, "name", None) == name for node in tree.body)


def resolve_python(dotted):
    """Whether a dotted Python name of the guide exists; see the module's docstring."""
    for prefix in sorted(INSTANCES, key=len, reverse=True):
        if dotted == prefix or dotted.startswith(prefix + "."):
            module, cls = INSTANCES[prefix]
            target = getattr(importlib.import_module(module), cls)
            rest = dotted[len(prefix) + 1:].split(".") if dotted != prefix else []
            for attr in rest:
                if hasattr(target, attr):
                    target = getattr(target, attr)
                elif inspect.isclass(target) and re.search(
                        r"self\.%s\s*=" % re.escape(attr), inspect.getsource(target)):
                    return True   # an attribute every instance sets
                else:
                    return False
            return True
    parts = dotted.split(".")
    assert parts[0] == "muster", dotted
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            target = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] == "muster":
                continue          # not a module: an attribute of a shorter one
            return py_source_defines(module.split(".", 1)[1], parts[i])   # a missing dependency
        for attr in parts[i:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


class GuideTables(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, PYTHON_DIR)
        head, agent = test_docs_routes.documented()
        cls.endpoints = head | agent
        with open(os.path.join(ROOT, "include", "muster.h"), encoding="utf-8") as f:
            cls.header = f.read()
        cls.helps = {}

    def help_text(self, words):
        """`muster help WORDS`'s usage text, or None when muster has no such command."""
        key = tuple(words)
        if key not in self.helps:
            r = subprocess.run([harness.MUSTER_BIN, "help"] + words, capture_output=True,
                               text=True, timeout=30)
            self.helps[key] = r.stdout if r.returncode == 0 else None
        return self.helps[key]

    def check_span(self, span):
        """None when `span` names something muster has (or is no name this test
        reads), else what is wrong."""
        if span.startswith("muster ") and not span.startswith("muster."):
            argv = shlex.split(span)
            words = cli_words(argv)
            if not words:
                return "no command"
            usage = self.help_text(words)
            if usage is None:
                return "no command `muster %s`" % " ".join(words)
            options = []
            for word in argv[1:]:
                if word == "--":
                    break
                if word.startswith("--"):
                    options.append(word.split("=")[0])
            missing = [o for o in options
                       if not re.search(r"(^|\s|\[)%s(?![\w-])" % re.escape(o), usage)]
            if missing:
                return "options not in `muster help %s`: %s" % (" ".join(words), missing)
            return None
        http = HTTP.match(span)
        if http:
            method = "GET" if http.group(1) == "HEAD" else http.group(1)
            path = test_docs_routes.shape(http.group(2).split("?")[0])
            return None if (method, path) in self.endpoints else "not an endpoint of docs/api.md"
        setting = re.match(r'^(strategy|shuffle)="([a-z_]+)"$', span)
        if setting:
            iteration = importlib.import_module("muster.iteration")
            known = iteration.STRATEGIES if setting.group(1) == "strategy" else iteration.SHUFFLES
            return None if setting.group(2) in known else "not a %s of muster" % setting.group(1)
        if re.match(r"^muster_[a-z_]+$", span):
            return None if re.search(r"\b%s\b" % span, self.header) else "not in include/muster.h"
        name = PY_NAME.match(span)
        if name and (name.group(1).startswith("muster.") or
                     name.group(1).split(".")[0] in INSTANCES):
            return None if resolve_python(name.group(1).rstrip(".")) else "no such Python name"
        return None

    def test_what_the_tables_name_exists(self):
        checked = 0
        for tool, section in tool_sections(parse(read_guide())).items():
            for line, cell in section.table_cells:
                for span in SPAN.findall(cell):
                    with self.subTest(tool=tool, line=line, span=span):
                        self.assertIsNone(self.check_span(span), "line %d: `%s`" % (line, span))
                    checked += 1
        self.assertGreater(checked, 100)

    def test_a_wrong_name_is_found(self):
        # The checks themselves, on names muster does not have.
        for span in ("muster iter frobnicate NAME", "muster iter create NAME --no-such-option",
                     "POST /v1/no/such/route", "muster_no_such_call", "client.no_such_call(x)",
                     "muster.NoSuchClass", "muster.iteration.Stream.no_such", "worker.no_such",
                     'strategy="adaptive"'):
            with self.subTest(span=span):
                self.assertIsNotNone(self.check_span(span))
        for span in ("muster iter create NAME --world-size W", "GET /v1/iterations/{name}",
                     "muster_loader_open", "client.shared.set(s, n, d)", "worker.job_id",
                     "muster.torch.DistributedSampler(dataset)", "stream.take(n)",
                     'strategy="dynamic"', 'shuffle="shard"'):
            with self.subTest(span=span):
                self.assertIsNone(self.check_span(span))


# ---- the examples -------------------------------------------------------------------

class GuideExamples(unittest.TestCase):
    sections = None

    @classmethod
    def setUpClass(cls):
        cls.sections = tool_sections(parse(read_guide()))

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="muster-coming-from-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.head = harness.Head().start()
        self.addCleanup(self.head.cleanup)
        bin_dir = os.path.join(self.work, "bin")
        os.mkdir(bin_dir)
        os.symlink(os.path.abspath(harness.MUSTER_BIN), os.path.join(bin_dir, "muster"))
        env = node_harness.no_gpu_env(
            {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")})
        env.update(MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token,
                   MUSTER_BIN=os.path.abspath(harness.MUSTER_BIN), TMPDIR=self.work,
                   PYTHONPATH=PYTHON_DIR, PYTHONDONTWRITEBYTECODE="1",
                   PATH=bin_dir + ":" + env["PATH"])
        self.env = env
        self.agents = []

    def tearDown(self):
        for proc, _ in self.agents:
            harness.stop_process(proc)

    def agent_logs(self):
        out = []
        for _, log in self.agents:
            with open(log, errors="replace") as f:
                out.append("--- %s\n%s" % (log, f.read()[-3000:]))
        return "\n".join(out)

    def start_node(self, block):
        """Runs a node block in bash under NODE_SHIM; returns the agent's API URL."""
        node_dir = os.path.join(self.work, "node-" + block.name)
        os.mkdir(node_dir)
        log = os.path.join(node_dir, "agent.log")
        env = dict(self.env, DOCS_NODE_NAME="docs-" + block.name, DOCS_NODE_DIR=node_dir)
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", NODE_SHIM + block.code], env=env, cwd=self.work,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.agents.append((proc, log))
        deadline = time.monotonic() + NODE_START_S
        lock = os.path.join(node_dir, "lock")
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.fail("%s: the agent exited with %s\n%s" % (block.name, proc.returncode,
                                                                self.agent_logs()))
            try:
                with open(lock) as f:
                    info = dict(line.split(" ", 1) for line in f.read().splitlines() if " " in line)
            except OSError:
                info = {}
            if info.get("listen", "").startswith("http://"):
                return info["listen"]
            time.sleep(0.05)
        self.fail("%s: the agent did not listen within %d s\n%s" % (block.name, NODE_START_S,
                                                                   self.agent_logs()))

    def run_example(self, block, env):
        suffix = ".py" if block.lang == "python" else ".sh"
        path = os.path.join(self.work, "example-" + block.name + suffix)
        with open(path, "w") as f:
            f.write(block.code)
        argv = ([PY, path] if block.lang == "python"
                else ["bash", "-e", "-u", "-o", "pipefail", path])
        try:
            return subprocess.run(argv, env=env, cwd=self.work, capture_output=True, text=True,
                                  timeout=EXAMPLE_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            self.fail("%s did not end within %d s; stdout:\n%s\nstderr:\n%s\n%s" % (
                block.name, EXAMPLE_TIMEOUT_S, e.stdout, e.stderr, self.agent_logs()))

    def check_section(self, tool):
        section = self.sections[tool]
        env = dict(self.env)
        urls = [self.start_node(b) for b in section.marked("node")]
        if urls:
            env["NODE_URL"] = urls[0]
        examples, outputs = section.marked("example"), section.marked("output")
        self.assertEqual((len(examples), len(outputs)), (1, 1),
                         "%s: an example and its output" % section.title)
        example, expected = examples[0], outputs[0].code
        r = self.run_example(example, env)
        why = "the example of %s (%s, line %d) exited %d\nstdout:\n%s\nstderr:\n%s\n%s" % (
            section.title, GUIDE, example.line, r.returncode, r.stdout, r.stderr, self.agent_logs())
        self.assertEqual(r.returncode, 0, why)
        self.assertEqual(r.stdout, expected, why)

    def test_lavender_data(self):
        self.check_section("Lavender Data")

    def test_tenflowers(self):
        self.check_section("tenflowers")

    def test_distcompute(self):
        self.check_section("DistCompute")

    def test_alpcrun(self):
        self.check_section("ALPCRUN.CH")

    def test_distributed_computing(self):
        self.check_section("distributed_computing")

    def test_a_shell_example_runs_under_bash_e_with_the_cli(self):
        # No section has a shell example now; one that is added runs this way: `muster`
        # on PATH talks to the test's head, and a failing command ends the example.
        script = "muster queue create q >/dev/null\nmuster put --queue q hello\nfalse\necho on\n"
        block = Block("example", "self-check", "sh", script, 0)
        r = self.run_example(block, self.env)
        self.assertEqual((r.returncode, r.stdout), (1, "1\n"), r.stderr)
        self.assertEqual(self.head.request("GET", "/v1/tasks/1").json["payload"], "hello")


if __name__ == "__main__":
    unittest.main()
