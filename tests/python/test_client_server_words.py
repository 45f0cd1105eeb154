"""A Client that cannot connect names what was to answer at its URL as the CLI does
(src/cli/conn.c): the head or the node agent, as the ``Server`` header of the client's
earlier replies said, or both while none said.  It asked "is a head running there?" for
any refused connection, also at a node agent's URL."""
import os
import shutil
import sys
import tempfile
import unittest

from common import ROOT, harness, muster
from muster import client as client_module

sys.path.append(os.path.join(ROOT, "tests", "integration"))   # after tests/python: its test_* names win
import node_harness  # noqa: E402


class ServerWordsTest(unittest.TestCase):
    def setUp(self):
        self.head = harness.Head([]).start()
        self.addCleanup(self.head.cleanup)

    def refused(self, client):
        with self.assertRaises(muster.NetworkError) as cm:
            client.queues()
        text = str(cm.exception)
        self.assertIn("Connection refused; ", text)
        return text.split("Connection refused; ", 1)[1]

    def test_the_head_it_talked_to(self):
        c = muster.Client(self.head.url, self.head.token)
        self.addCleanup(c.close)
        self.assertIsNone(c.server)   # no reply yet
        c.queues()
        self.assertEqual(c.server, "head")
        self.head.kill()
        self.assertEqual(self.refused(c), "is the head running there? The URL is the one url= "
                         "gives: start the head, or give the URL of a running one")
        self.assertEqual(c.server, "head")   # a request without a reply leaves it

    def test_the_node_agent_it_talked_to(self):
        work = tempfile.mkdtemp(prefix="muster-server-words-")
        self.addCleanup(shutil.rmtree, work, True)
        agent = node_harness.Agent(self.head, work, name="words")
        self.addCleanup(agent.stop)
        agent.start()
        c = muster.Client(agent.url, self.head.token)
        self.addCleanup(c.close)
        c.queues()   # the head's reply, passed on by the agent
        self.assertEqual(c.server, "node")
        self.assertEqual(agent.stop(), 0, agent.log())
        self.assertEqual(self.refused(c), "is the node agent running there? The URL is the one "
                         "url= gives: start it, or give the URL of a running one")

    def test_nothing_known_names_both(self):
        url = self.head.url
        self.head.kill()
        self.assertEqual(self.refused(muster.Client(url, "t")), "is a muster head or node agent "
                         "running there? The URL is the one url= gives: start it, or give the "
                         "URL of a running one")

    def test_what_a_reply_says(self):
        server_of = client_module.server_of
        self.assertEqual(server_of("muster-head", None), "head")
        self.assertEqual(server_of("muster-head/1.3 (linux)", None), "head")
        self.assertEqual(server_of("muster-node", None), "node")
        # The head's reply an agent passed on: the agent's Server, and its Via.
        self.assertEqual(server_of("muster-node", "1.1 gpu-1 (muster node)"), "node")
        self.assertEqual(server_of(None, "1.1 gpu-1 (muster node)"), "node")   # an older agent
        self.assertIsNone(server_of("muster-headless", None))
        self.assertIsNone(server_of("nginx/1.25", "1.1 proxy"))
        self.assertIsNone(server_of(None, None))


if __name__ == "__main__":
    unittest.main()
