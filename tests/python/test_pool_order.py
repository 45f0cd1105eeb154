"""``muster.Pool`` called in distributed_computing's positional order, ``Pool(worker_class,
init_data, password, server_address[, server_port])``: read as such when the fourth
argument is an address, and otherwise refused with a message that says muster's order
and the keywords to use (without echoing the password).  No worker runs: opening the
pool's session is all these checks need."""
import unittest
import urllib.parse

from common import HeadTestCase, muster

import pool_workers

INIT = {"args": [{"k": 1, "dir": "."}]}


class DistributedComputingOrderTest(HeadTestCase):

    def setUp(self):
        super().setUp()
        parts = urllib.parse.urlsplit(self.head.url)
        self.host, self.port = parts.hostname, parts.port

    def opened(self, pool, queue="pool"):
        self.addCleanup(pool.close)
        self.assertEqual((pool.client.url, pool.client.token, pool.queue),
                         (self.head.url, self.head.token, queue))
        self.assertEqual(self.c.session(pool.session)["queue"], queue)

    def test_password_then_address_with_its_port(self):
        self.opened(muster.Pool(pool_workers.Echo, INIT, self.head.token,
                                "%s:%d" % (self.host, self.port)))

    def test_password_then_address_then_port(self):
        self.opened(muster.Pool(pool_workers.Echo, INIT, self.head.token, self.host, self.port))

    def test_password_then_url(self):
        self.opened(muster.Pool(pool_workers.Echo, INIT, self.head.token, self.head.url, "q2"),
                    queue="q2")

    def test_muster_order_is_unchanged(self):
        self.opened(muster.Pool(pool_workers.Echo, INIT, self.head.url, self.head.token))

    def test_a_password_without_an_address_is_refused_saying_the_order(self):
        for args in (("s3cret-pw",), ("s3cret-pw", "headnode")):
            with self.assertRaises(ValueError) as cm:
                muster.Pool(pool_workers.Echo, INIT, *args)
            text = str(cm.exception)
            self.assertIn("muster.Pool(worker_class, init_data, url, token, queue, ...)", text)
            self.assertIn('url="http://HOST:7370", token=PASSWORD', text)
            self.assertIn("distributed_computing's order", text)
            self.assertNotIn("s3cret-pw", text)   # it may be a password

    def test_a_port_twice_is_refused(self):
        with self.assertRaises(ValueError) as cm:
            muster.Pool(pool_workers.Echo, INIT, self.head.token,
                        "%s:%d" % (self.host, self.port), self.port)
        self.assertIn("give one of them", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
