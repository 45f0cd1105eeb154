"""A node cache streams a cold level (docs/shared-data.md "Node cache"): a reader gets the
first bytes while the fetch from the head still runs (here held half way by a proxy
between the agent and the head), and so does a second reader that joins the fetch; the
last byte waits for the whole level to match its checksum, so bytes that do not match
reach a reader as a body cut short, never as a complete one, and nothing is cached; a
fetch cut half way ends the readers' bodies short too, and the next read fetches again;
so does an agent that stops while it streams, which ends and joins the fetch first; a
fetch whose temporary file is removed starts again once for its readers; and a level
still streaming to a reader is not evicted."""
import http.client
import os
import shutil
import signal
import sys
import tempfile
import threading
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402

MIB = 1 << 20
SIZE = 8 * MIB


def held_half_way(gate):
    """A proxy body that sends half the level, then waits for `gate`."""
    def body(pieces):
        sent = 0
        for piece in pieces:
            if sent >= SIZE // 2 and not gate.is_set():
                assert gate.wait(60), "the test never opened the gate"
            yield piece
            sent += len(piece)
    return body


def one_byte_changed(pieces):
    for i, piece in enumerate(pieces):
        yield piece if i != 3 else bytes([piece[0] ^ 1]) + piece[1:]


def cut_half_way(pieces):
    sent = 0
    for piece in pieces:
        if sent >= SIZE // 2:
            return
        yield piece
        sent += len(piece)


def agent_threads(agent):
    """The ids of the agent process's threads."""
    return os.listdir("/proc/%d/task" % agent.proc.pid)


def tcp_state(local_port, remote_port):
    """The state of the loopback TCP connection from `local_port` to `remote_port` as
    /proc/net/tcp gives it ("01": established), or None when there is none."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, remote, state = line.split()[1:4]
            if (int(local.split(":")[1], 16), int(remote.split(":")[1], 16)) == (
                    local_port, remote_port):
                return state
    return None


class NodeCacheStreamTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-cache-stream-")
        self.head = harness.Head().start()
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.addCleanup(self.head.cleanup)
        self.data = os.urandom(SIZE)
        r = self.head.request("PUT", "/v1/shared/models/w", raw=self.data,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)

    def agent_behind(self, body, method="GET"):
        """An agent whose head is a proxy that passes the first `method` request of the
        level through `body` (a RequestProxy decision) and forwards everything else."""
        return self.agent_through(harness.RequestProxy(
            self.head, lambda m, path: m == method and path == "/v1/shared/models/w",
            lambda n: body if n == 1 else "forward"))

    def agent_through(self, proxy):
        """An agent whose head is `proxy` (a harness.RequestProxy in front of the head)."""
        self.addCleanup(proxy.close)
        head = types.SimpleNamespace(url=proxy.url, token=self.head.token)
        a = Agent(head, self.dir, "s1", args=["--cache-dir", os.path.join(self.dir, "cache")])
        self.addCleanup(a.kill)
        return a.start()

    def open_read(self, agent, name="w"):
        """A GET of a level through the agent, its status line and headers read."""
        conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=30)
        self.addCleanup(conn.close)
        conn.request("GET", "/v1/shared/models/" + name,
                     headers={"Authorization": "Bearer " + self.head.token})
        return conn.getresponse()

    def stats(self, agent):
        r = agent.request("GET", "/v1/node/cache")
        self.assertEqual(r.status, 200, r)
        return r.json

    def test_readers_get_bytes_while_the_fetch_runs(self):
        gate = threading.Event()
        self.addCleanup(gate.set)
        a = self.agent_behind(held_half_way(gate))
        first = self.open_read(a)
        self.assertEqual((first.status, first.getheader("X-Muster-Cache")), (200, "miss"))
        self.assertEqual(int(first.getheader("Content-Length")), SIZE)
        self.assertEqual(first.read(MIB), self.data[:MIB])
        second = self.open_read(a)  # joins the same fetch, still held half way
        self.assertEqual(second.status, 200)
        self.assertEqual(second.read(MIB), self.data[:MIB])
        s = self.stats(a)
        self.assertEqual((s["fetching_bytes"], s["entries"], s["upstream_fetches"]),
                         (SIZE, 0, 1), s)
        gate.set()
        self.assertEqual(first.read(), self.data[MIB:])
        self.assertEqual(second.read(), self.data[MIB:])
        s = self.stats(a)
        self.assertEqual((s["misses"], s["coalesced"], s["bytes_served"], s["entries"]),
                         (2, 1, 2 * SIZE, 1), s)

    def test_bytes_that_do_not_match_the_checksum_never_make_a_whole_body(self):
        a = self.agent_behind(one_byte_changed)
        r = self.open_read(a)
        self.assertEqual(r.status, 200)
        with self.assertRaises(http.client.IncompleteRead) as cut:
            r.read()
        self.assertLess(len(cut.exception.partial), SIZE)
        s = self.stats(a)
        self.assertEqual((s["fetch_failures"], s["entries"], s["bytes_served"]), (1, 0, 0), s)
        again = a.request("GET", "/v1/shared/models/w")  # the proxy forwards it unchanged
        self.assertEqual((again.status, again.raw == self.data), (200, True))

    def test_a_fetch_cut_half_way_cuts_the_readers_short(self):
        a = self.agent_behind(cut_half_way)
        r = self.open_read(a)
        self.assertEqual(r.status, 200)
        with self.assertRaises(http.client.IncompleteRead) as cut:
            r.read()
        self.assertLessEqual(len(cut.exception.partial), SIZE // 2)
        self.assertEqual(cut.exception.partial, self.data[:len(cut.exception.partial)])
        self.assertIn("cache: fetching models/w level 1", a.log())
        again = a.request("GET", "/v1/shared/models/w")
        self.assertEqual((again.status, again.raw == self.data), (200, True))
        self.assertEqual(self.stats(a)["upstream_fetches"], 2)

    def test_an_agent_that_stops_mid_level_ends_its_fetch_before_it_leaves(self):
        # The fetch is stalled half way (the proxy sends nothing more) when the agent is
        # told to stop.  The stop ends the transfer and joins the fetch's thread before
        # the agent says goodbye to the head (DELETE /v1/nodes/NAME, held here by the
        # proxy): while the goodbye waits, the agent has no thread and no connection of
        # the fetch left.  Then it exits with 0 (under the ASan build: nothing reported),
        # and the reader's body was cut short.
        gate, goodbye_held, goodbye_go = (threading.Event() for _ in range(3))
        self.addCleanup(gate.set)
        self.addCleanup(goodbye_go.set)

        def held_goodbye(pieces):
            goodbye_held.set()
            assert goodbye_go.wait(60), "the test never let the goodbye go"
            yield from pieces

        def decide(n):
            return held_half_way(gate) if proxy.requests[n - 1][0] == "GET" else held_goodbye

        proxy = harness.RequestProxy(self.head, lambda m, path: (m, path) in {
            ("GET", "/v1/shared/models/w"), ("DELETE", "/v1/nodes/s1")}, decide)
        a = self.agent_through(proxy)
        harness.wait_until(lambda: self.head.request("GET", "/v1/nodes/s1").status == 200,
                           what="the agent registered")
        threads = len(agent_threads(a))
        r = self.open_read(a)
        self.assertEqual(r.read(MIB), self.data[:MIB])
        fetch = (proxy.requests[0][2][1], proxy.server.server_address[1])
        self.assertEqual((len(agent_threads(a)), tcp_state(*fetch)), (threads + 1, "01"))
        a.proc.send_signal(signal.SIGTERM)
        self.assertTrue(goodbye_held.wait(30), a.log())
        self.assertEqual(len(agent_threads(a)), threads, "a thread outlived the cache's stop")
        self.assertNotEqual(tcp_state(*fetch), "01", "the fetch's connection is still open")
        goodbye_go.set()
        self.assertEqual(a.proc.wait(30), 0, a.log())
        with self.assertRaises(http.client.IncompleteRead) as cut:
            r.read()
        self.assertEqual(cut.exception.partial, self.data[MIB:MIB + len(cut.exception.partial)])
        self.assertLess(MIB + len(cut.exception.partial), SIZE)

    def test_a_fetch_whose_temporary_file_is_removed_starts_again_for_its_reader(self):
        # The cache's @tmp directory is deleted (a cleaner of temporary files, say) while
        # a level's fetch is held half way, its reader streaming: the finished file
        # cannot be renamed into place, so the fetch starts once more, into a new file in
        # an @tmp made anew, for the same reader, whose body goes on and is whole.
        gate = threading.Event()
        self.addCleanup(gate.set)
        a = self.agent_behind(held_half_way(gate))
        r = self.open_read(a)
        self.assertEqual(r.read(MIB), self.data[:MIB])
        tmp = os.path.join(self.dir, "cache", "@tmp")
        shutil.rmtree(tmp)
        gate.set()
        self.assertEqual(r.read(), self.data[MIB:])
        s = self.stats(a)
        self.assertEqual((s["upstream_fetches"], s["fetch_failures"], s["entries"],
                          s["fetching_bytes"]), (2, 0, 1, 0), s)
        self.assertTrue(os.path.isdir(tmp))
        self.assertEqual(os.listdir(tmp), [])
        hit = a.request("GET", "/v1/shared/models/w")
        self.assertEqual((hit.status, hit.headers["X-Muster-Cache"], hit.raw == self.data),
                         (200, "hit", True))

    def test_a_fetch_whose_file_is_removed_twice_fails_and_is_fetched_again(self):
        # Fetched once more, not forever: the @tmp directory deleted under the fetch's
        # second try too cuts the reader short; the next read fetches the level anew.
        gates = [threading.Event(), threading.Event()]
        for gate in gates:
            self.addCleanup(gate.set)
        proxy = harness.RequestProxy(
            self.head, lambda m, path: m == "GET" and path == "/v1/shared/models/w",
            lambda n: held_half_way(gates[n - 1]) if n <= 2 else "forward")
        a = self.agent_through(proxy)
        r = self.open_read(a)
        self.assertEqual(r.read(MIB), self.data[:MIB])
        tmp = os.path.join(self.dir, "cache", "@tmp")
        shutil.rmtree(tmp)
        gates[0].set()
        harness.wait_until(lambda: proxy.count == 2 and os.listdir(tmp), 30,
                           what="the second fetch")
        shutil.rmtree(tmp)
        gates[1].set()
        with self.assertRaises(http.client.IncompleteRead) as cut:
            r.read()
        self.assertEqual(cut.exception.partial, self.data[MIB:MIB + len(cut.exception.partial)])
        s = self.stats(a)
        self.assertEqual((s["upstream_fetches"], s["fetch_failures"], s["entries"]), (2, 1, 0), s)
        self.assertIn("was removed", a.log())
        again = a.request("GET", "/v1/shared/models/w")
        self.assertEqual((again.status, again.raw == self.data), (200, True))
        self.assertEqual(self.stats(a)["upstream_fetches"], 3)

    def test_a_malformed_expiry_from_the_head_is_not_passed_on(self):
        # The head's HEAD before the fetch names an expiry that is not a number: the
        # agent says so in its log and serves the level with no expiry, rather than
        # passing the text on to its readers (or reading "12" of "12abc").
        a = self.agent_behind({"headers": {"X-Muster-Expires-Ms": "12abc"}}, method="HEAD")
        r = a.request("GET", "/v1/shared/models/w")
        self.assertEqual((r.status, r.raw), (200, self.data))
        self.assertIsNone(r.headers.get("X-Muster-Expires-Ms"), r.headers)
        self.assertIn('malformed X-Muster-Expires-Ms ("12abc")', a.log())

    def test_a_level_still_streaming_is_not_evicted(self):
        # A reader that stopped reading a cold 64 MiB level streamed to it holds it
        # (what the sockets do not take stays queued as pieces of the file): another
        # level's fetch, which needs the room, leaves it in place.
        big = os.urandom(64 * MIB)
        for name in ("big", "other"):
            r = self.head.request("PUT", "/v1/shared/models/" + name, raw=big,
                                  content_type="application/octet-stream")
            self.assertEqual(r.status, 201, r)
        a = Agent(self.head, self.dir, "s2", args=[
            "--cache-dir", os.path.join(self.dir, "cache2"), "--cache-bytes", str(100 * MIB)])
        self.addCleanup(a.kill)
        a.start()
        slow = self.open_read(a, "big")
        self.assertEqual(slow.read(MIB), big[:MIB])
        harness.wait_until(lambda: self.stats(a)["entries"] == 1, 30, what="big in the cache")
        other = a.request("GET", "/v1/shared/models/other")
        self.assertEqual((other.status, other.raw == big), (200, True))
        # Only one fits: `big`, the least recently used, would go, but being read it
        # stays, and `other` goes once sent.
        s = self.stats(a)
        self.assertEqual((s["entries"], s["evictions"]), (1, 1), s)
        r = a.request("GET", "/v1/node/cache/models/big")
        self.assertEqual((r.status, r.json["cache"]), (200, "hit"), r)
        self.assertEqual(slow.read(), big[MIB:])


if __name__ == "__main__":
    unittest.main(verbosity=2)
