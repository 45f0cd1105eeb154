"""docs/api.md against the code: every route the head or a node agent serves is
documented with the same method and path shape, every documented endpoint is served,
and a running head (and agent) routes each documented one.

Served routes are read from the source: the head's route tables (every
`http_route_t NAME[] = {...}` in src/server and src/node) and the node agent's own
dispatchers, which are code, not tables (src/node/cache_http.c and
src/node/iter_local.c): what is parseable there is parsed, the rest is listed below
with where it comes from.  Any other place that compares a request path with a literal
fails the test until it is listed here, so a new dispatcher cannot go unseen.

Documented endpoints are the headings of docs/api.md, as in
    ### `GET /v1/queues/{queue}?ready=true`
(a query after `?`, or an optional one in `[...]`, is not part of the path), the rows of
its DistCompute tracker table (paths under `/compat/distcompute/{pipeline}`), and for the
agent's own endpoints the headings marked "(node agent)" and the table of
docs/shared-data.md "Node cache".  `{}` in a table matches `{name}` in the docs; a
documented `HEAD` is the GET route (the head answers HEAD on every GET route).
"""
import glob
import os
import re
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# Read from the environment so that a check of this test can point it at edited copies.
SRC = os.environ.get("MUSTER_DOCS_TEST_SRC", os.path.join(ROOT, "src"))
DOCS = os.environ.get("MUSTER_DOCS_TEST_DOCS", os.path.join(ROOT, "docs"))

METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE", "PATCH")
# A documented endpoint in backquotes: `METHOD /path?query`.
ENDPOINT = re.compile(r"`(%s) (/[^`?[\s]*)[^`]*`" % "|".join(METHODS))
TABLE_ROW = re.compile(r'\{\s*"([A-Z]+)",\s*"([^"]*)"')

# Routes whose `{}` segment takes one literal only, which the docs name: the handler
# checks it (src/server/dashboard.c, dashboard_h_compat_page: the second segment is
# "leaderboard"; any other answers 404 "no page").
LITERAL_PARAMS = {
    ("GET", "/compat/distcompute/{}/{}"): ("GET", "/compat/distcompute/{}/leaderboard"),
}

# Path literals that serving code outside the route tables and the dispatchers this
# test reads compares request paths with, and why each needs no route of its own.
KNOWN_PATH_COMPARES = {
    # A PUT of shared data is streamed to disk before the route runs; the table's
    # PUT /v1/shared/{}/{} routes it.
    ("server/shared_upload.c", "/v1/shared/"),
}
# strcmp, strncmp, strcasecmp, strncasecmp of something with a literal "/...".
PATH_COMPARE = re.compile(r'str(?:n?case)?n?cmp\([^,]*,\s*"(/[^"]*)"')


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def shape(path):
    """A path's shape: every `{name}` as `{}`, no trailing slash (but `/`)."""
    path = re.sub(r"\{[^}/]*\}", "{}", path)
    return path.rstrip("/") or "/"


def head_routes():
    """(method, pattern) of every row of every http_route_t table of the sources."""
    routes = set()
    for path in sorted(glob.glob(os.path.join(SRC, "*", "*.c"))):
        for table in re.findall(r"http_route_t\s+\w+\[\]\s*=\s*\{(.*?)\n\};", read(path), re.S):
            rows = TABLE_ROW.findall(table)
            # The last row ends the table: {NULL, NULL, ...}.
            entries = len(re.findall(r"^\s*\{", table, re.M))
            assert entries == len(rows) + 1, "%s: a row of the route table was not read" % path
            routes.update((m, p) for m, p in rows)
    assert routes, "no route table found under " + SRC
    return routes


def function_body(text, name):
    """The text of C function `name`'s body in `text` (from its signature to the
    first closing brace at the start of a line)."""
    m = re.search(r"\b%s\([^)]*\)\s*\{(.*?)\n\}" % name, text, re.S)
    assert m, "no function %s found" % name
    return m.group(1)


def cache_literals():
    """The paths the node cache's dispatcher (src/node/cache_http.c, cache_http_handle)
    compares the request's with."""
    body = function_body(read(os.path.join(SRC, "node", "cache_http.c")), "cache_http_handle")
    assert 'strcmp(h1_method(in), "GET") != 0' in body, \
        "cache_http_handle no longer takes GET alone"
    literals = set(re.findall(r'strn?cmp\(path, "(/[^"]*)"', body))
    assert literals, "cache_http_handle compares no path"
    return literals


def cache_routes():
    """The node cache's routes: GET only; a compared prefix ends in SCOPE/NAME
    (creq_read_names reads two names), a whole path is itself."""
    return {("GET", literal + "{}/{}" if literal.endswith("/") else literal)
            for literal in cache_literals()}


# The node-local iterations' operations (src/node/iter_local.c, il_route) that are
# chosen by method alone, and their paths; the others are read from the comparisons of
# the rest of the path.
IL_OPS_BY_METHOD = {"IL_CREATE": "/v1/iterations", "IL_LIST": "/v1/iterations",
                    "IL_GET": "/v1/iterations/{}", "IL_DELETE": "/v1/iterations/{}"}


def iter_local_routes():
    """The node-local iterations' routes (src/node/iter_local.c, il_route)."""
    body = function_body(read(os.path.join(SRC, "node", "iter_local.c")), "il_route")
    assert 'prefix[] = "/v1/iterations"' in body, "il_route's prefix changed"
    routes, ops = set(), set(re.findall(r"\bIL_[A-Z]+\b", body))
    # get: GET, and HEAD (a GET without its body, as the head's routes take it)
    assert 'get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;' in body and \
        'post = strcmp(method, "POST") == 0;' in body, "il_route's method flags changed"
    for method, suffix, op in re.findall(
            r'\b(get|post) && strcmp\(rest, "(/[^"]*)"\) == 0\)\s*return (IL_\w+);', body):
        routes.add((method.upper(), "/v1/iterations/{}" + suffix))
        ops.discard(op)
    for method, op in (re.findall(r"\b(get|post) \? (IL_\w+)", body) +
                       re.findall(r'strcmp\(method, "(\w+)"\) == 0 \? (IL_\w+)', body)):
        assert op in IL_OPS_BY_METHOD, "il_route: %s has no path in this test" % op
        routes.add((method.upper(), IL_OPS_BY_METHOD[op]))
        ops.discard(op)
    ops.discard("IL_NONE")
    assert not ops, "il_route: operations this test does not read: %s" % sorted(ops)
    return routes


def path_compares():
    """(file under src, literal) of every comparison of a string with a path literal in
    the code that serves requests (the head's and the agent's), less the node cache's
    and the node-local iterations' (read by cache_routes and iter_local_routes)."""
    found = set()
    for path in sorted(glob.glob(os.path.join(SRC, "server", "*.c")) +
                       glob.glob(os.path.join(SRC, "node", "*.c"))):
        rel = os.path.relpath(path, SRC)
        for literal in PATH_COMPARE.findall(read(path)):
            found.add((rel, literal))
    il_prefix = "/v1/iterations/{}"
    il_suffixes = {("node/iter_local.c", path[len(il_prefix):])
                   for _, path in iter_local_routes() if path.startswith(il_prefix + "/")}
    return (found - {("node/cache_http.c", literal) for literal in cache_literals()}
            - il_suffixes)


def api_sections(text):
    """(heading line, the lines under it) of each heading of `text`."""
    sections = []
    for line in text.splitlines():
        if re.match(r"#+ ", line):
            sections.append((line, []))
        elif sections:
            sections[-1][1].append(line)
    return sections


def distcompute_rows(lines):
    """The DistCompute tracker table's endpoints: the first cell of each row, under the
    prefix the section names (`/compat/distcompute/{pipeline}`)."""
    prefix = re.search(r"`(/compat/distcompute/\{[a-z_]+\})`", "\n".join(lines))
    assert prefix, "the DistCompute tracker section names no /compat/distcompute/{...} prefix"
    found = set()
    for line in lines:
        if line.startswith("|"):
            for method, path in ENDPOINT.findall(line.split("|")[1]):
                found.add((method, (prefix.group(1) + path).rstrip("/")))
    assert found, "the DistCompute tracker table lists no endpoint"
    return found


def documented_endpoints():
    """(the head's, the node agent's own) endpoints as docs/api.md names them:
    (method, path with its {name}s)."""
    head, agent = set(), set()
    for heading, lines in api_sections(read(os.path.join(DOCS, "api.md"))):
        into = agent if "(node agent)" in heading else head
        into.update(ENDPOINT.findall(heading))
        if heading.strip("# ") == "DistCompute tracker routes":
            head |= distcompute_rows(lines)
    return head, agent


def documented():
    """documented_endpoints() by shape, a HEAD as its GET route."""
    return tuple({("GET" if m == "HEAD" else m, shape(p)) for m, p in endpoints}
                 for endpoints in documented_endpoints())


def shared_data_agent_table():
    """The rows of docs/shared-data.md's "request on the agent" table that name one
    endpoint (the agent's own; its last row says what is forwarded)."""
    text = read(os.path.join(DOCS, "shared-data.md"))
    table = re.search(r"\| request on the agent \|.*?\n\n", text, re.S)
    assert table, "docs/shared-data.md has no 'request on the agent' table"
    rows = set()
    for line in table.group(0).strip().splitlines()[2:]:
        found = ENDPOINT.findall(line.split("|")[1])
        if len(found) == 1:
            rows.add((found[0][0], shape(found[0][1])))
    return rows


def as_documented(routes):
    return {LITERAL_PARAMS.get(r, r) for r in routes}


def listing(routes):
    return "\n".join("  %s %s" % r for r in sorted(routes))


class SourceAndDocs(unittest.TestCase):
    """Both directions, from the source and the docs alone."""

    def assertNone(self, routes, why):
        if routes:
            self.fail(why + ":\n" + listing(routes))

    def test_every_served_route_is_documented(self):
        docs_head, docs_agent = documented()
        self.assertNone(as_documented(head_routes()) - docs_head,
                        "served by the head but with no heading in docs/api.md "
                        "(### `METHOD /path`)")
        agent_own = (cache_routes() | iter_local_routes()) - head_routes()
        self.assertNone(agent_own - docs_agent, "served by the node agent itself but with "
                        "no '(node agent)' heading in docs/api.md")

    def test_every_documented_endpoint_is_served(self):
        docs_head, docs_agent = documented()
        self.assertNone(docs_head - as_documented(head_routes()),
                        "documented in docs/api.md but served by no route of the head")
        self.assertNone(docs_agent - (cache_routes() | iter_local_routes()),
                        "documented as a node agent endpoint in docs/api.md but not "
                        "served by the agent")
        self.assertNone(docs_head & docs_agent, "documented for both the head and the agent")

    def test_agent_answers_the_heads_api(self):
        """The agent's routes outside /v1/node/ are the head's API, answered by the agent
        (its cache, its node-local iterations): the head serves the same method and shape."""
        agent = cache_routes() | iter_local_routes()
        self.assertNone({r for r in agent if not r[1].startswith("/v1/node/")} - head_routes(),
                        "node agent routes outside /v1/node/ that the head does not serve")

    def test_shared_data_table_lists_the_cache_routes(self):
        self.assertEqual(shared_data_agent_table(), cache_routes(),
                         "docs/shared-data.md's 'request on the agent' table against "
                         "src/node/cache_http.c")

    def test_no_unlisted_path_dispatch(self):
        unknown = path_compares() - KNOWN_PATH_COMPARES
        if unknown:
            self.fail("serving code compares request paths with literals this test does not "
                      "know (a dispatcher outside the route tables?): read it, then route "
                      "it by a table or list it in KNOWN_PATH_COMPARES:\n" + "\n".join(
                          "  src/%s: %s" % u for u in sorted(unknown)))


def probe_path(path):
    """`path` with each `{name}` replaced by a dummy: ids by 1, names by docs-probe."""
    return re.sub(r"\{([^}]*)\}", lambda m: "1" if m.group(1) == "id" else "docs-probe", path)


def unrouted(reply):
    """True when `reply` is the router's own: no such endpoint, or not this method."""
    code = reply.error_code
    message = ((reply.json or {}).get("error") or {}).get("message", "")
    return (reply.status == 405 and code == "method_not_allowed") or (
        reply.status == 404 and code == "not_found" and message.startswith("no endpoint at "))


def probe(server, method, path):
    """`method` on `path` with dummies; a HEAD is sent as the GET it stands for (the
    router's refusal of a HEAD has no body to tell it by)."""
    body = {} if method in ("POST", "PUT") else None
    return server.request("GET" if method == "HEAD" else method, probe_path(path), body=body)


class Routed(unittest.TestCase):
    """Each documented method and path is routed by a running head (and the agent's own
    by an agent), with dummy names and ids and the harness's token."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="muster-docs-routes-")
        cls.head = harness.Head().start()
        cls.agent = node_harness.Agent(cls.head, cls.dir, "docs", args=[
            "--cache-dir", os.path.join(cls.dir, "cache"),
            "--state-dir", os.path.join(cls.dir, "state")])
        try:
            cls.agent.start()
        except Exception:
            cls.head.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.agent.kill()
        cls.head.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_probe_tells_unrouted(self):
        """The check below would notice: a path and a method nobody serves."""
        self.assertTrue(unrouted(self.head.request("GET", "/v1/no-such-thing")))
        self.assertTrue(unrouted(self.head.request("DELETE", "/v1/health")))
        self.assertTrue(unrouted(self.agent.request("GET", "/v1/no-such-thing")))

    def test_head_routes_every_documented_endpoint(self):
        head, _ = documented_endpoints()
        for method, path in sorted(head):
            with self.subTest(method=method, path=path):
                reply = probe(self.head, method, path)
                self.assertFalse(unrouted(reply), "%s %s: %r" % (method, path, reply))
        self.assertGreater(len(head), 50)

    def test_agent_routes_its_own_endpoints(self):
        _, agent = documented_endpoints()
        self.assertTrue(agent, "docs/api.md documents no node agent endpoint")
        for method, path in sorted(agent):
            with self.subTest(method=method, path=path):
                reply = probe(self.agent, method, path)
                self.assertFalse(unrouted(reply), "agent: %s %s: %r" % (method, path, reply))
                # The agent's own: the head does not serve it.
                self.assertTrue(unrouted(probe(self.head, method, path)),
                                "the head serves %s %s too" % (method, path))

if __name__ == "__main__":
    unittest.main()
