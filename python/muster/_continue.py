"""Uploads whose body waits for the server's ``100 Continue`` (``Expect: 100-continue``).

http.client sends a body right behind the request's head and skips interim replies, so
an upload the head refuses (a level conflict, a bad token, a body over its limit) would
go whole before its refusal is read: a wasted gigabyte, or a connection reset under a
body still being sent.  A request here sends its head with ``Expect: 100-continue`` and
reads what comes back itself, byte by byte, so that nothing past the interim reply is
taken from the connection:

- ``100 Continue``: the body goes, and the final reply is read as usual;
- a final status (the refusal): the body is never sent; that reply is the answer and
  the connection is not used again (the server cannot tell where our request ends);
- nothing within CONTINUE_WAIT_S: the body goes anyway, as curl does, since a server
  or proxy that ignores ``Expect`` waits for the body without answering.

Small bodies (EXPECT_MIN_BYTES or less) go without ``Expect``: the wait would cost a
round trip for a refusal that costs as little.
"""
import http.client
import io
import socket
import time

EXPECT_MIN_BYTES = 64 * 1024  # bodies this size or smaller are sent at once
CONTINUE_WAIT_S = 1.0         # how long the body waits for "100 Continue"
_MAX_LINE = 65536             # a reply's line, as http.client bounds it


def expect_headers(size):
    """The header that asks for ``100 Continue`` before a body of ``size`` bytes (None:
    not known in advance, sent chunked), or none for a small body."""
    if size is not None and size <= EXPECT_MIN_BYTES:
        return {}
    return {"Expect": "100-continue"}


def expects_continue(headers):
    """Whether ``headers`` (a dict) ask for ``100 Continue``."""
    return any(k.lower() == "expect" and str(v).lower() == "100-continue"
               for k, v in headers.items())


def request(conn, method, url, body, headers):
    """Sends ``method url`` on ``conn`` (an http.client connection, idle) with
    ``headers``, which ask for ``100 Continue``, and ``body``: bytes, or an iterable of
    bytes sent chunked unless ``headers`` give its Content-Length.  Returns the final
    reply's HTTPResponse, its body unread; when the server answered before the body
    was sent, the body never is and the response closes the connection at its end
    (``will_close``).  Network errors raise as http.client's own do."""
    names = {k.lower() for k in headers}
    chunked = False
    if "content-length" not in names and "transfer-encoding" not in names:
        if isinstance(body, (bytes, bytearray, memoryview)):
            headers = dict(headers, **{"Content-Length": str(memoryview(body).nbytes)})
        else:
            chunked = True
            headers = dict(headers, **{"Transfer-Encoding": "chunked"})
    conn.putrequest(method, url, skip_host="host" in names,
                    skip_accept_encoding="accept-encoding" in names)
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    final_line = _await_continue(conn.sock, CONTINUE_WAIT_S)
    if final_line is not None:
        return _refusal(conn, final_line)
    _send_body(conn, body, chunked)
    return conn.getresponse()


def _await_continue(sock, wait_s):
    """Waits up to ``wait_s`` for the reply to a request head that asked for ``100
    Continue``: None when the body is to go (the 100 came, and was read; or nothing came
    in time), else the status line of the final reply that came instead (read, the rest
    of that reply left on the connection)."""
    deadline = time.monotonic() + wait_s
    timeout = sock.gettimeout()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            first = sock.recv(1)
        except socket.timeout:
            return None   # a server that ignores Expect: the body goes
        finally:
            sock.settimeout(timeout)
        if not first:
            raise http.client.RemoteDisconnected("the server closed the connection without "
                                                 "a reply")
        line = _read_line(sock, first)
        status = _status(line)
        if status >= 200:
            return line
        _skip_headers(sock)
        if status == 100:
            return None
        # another interim reply (102 Processing, 103 Early Hints): wait on


def _read_line(sock, start=b""):
    """One line of a reply's head (its CRLF included), read a byte at a time so that
    nothing after it is taken from the socket."""
    line = bytearray(start)
    while not line.endswith(b"\n"):
        if len(line) > _MAX_LINE:
            raise http.client.LineTooLong("the reply's status line or a header")
        byte = sock.recv(1)
        if not byte:
            raise http.client.RemoteDisconnected("the server closed the connection in the "
                                                 "middle of its reply")
        line += byte
    return bytes(line)


def _status(line):
    """The status code of a reply's status line (``HTTP/1.1 100 Continue``)."""
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or len(parts[1]) != 3 \
            or not parts[1].isdigit():
        raise http.client.BadStatusLine(line.decode("latin-1"))
    return int(parts[1])


def _skip_headers(sock):
    """Reads an interim reply's header lines up to the empty line that ends them."""
    while _read_line(sock) not in (b"\r\n", b"\n"):
        pass


def _send_body(conn, body, chunked):
    """The body after its head: bytes as they are, an iterable's pieces in turn (each
    framed as a chunk when ``chunked``; an empty piece would end a chunked body, so
    empty ones are skipped)."""
    pieces = (body,) if isinstance(body, (bytes, bytearray, memoryview)) else body
    for piece in pieces:
        if not piece:
            continue
        conn.send(b"%X\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
    if chunked:
        conn.send(b"0\r\n\r\n")


class _Replayed:
    """The socket of a reply whose status line was read already: its makefile() gives
    that line first, then the socket's bytes (HTTPResponse reads its reply from
    ``sock.makefile("rb")``)."""

    def __init__(self, sock, head):
        self.sock, self.head = sock, head

    def makefile(self, mode):
        return io.BufferedReader(_ReplayedRaw(self.sock.makefile("rb", buffering=0), self.head))


class _ReplayedRaw(io.RawIOBase):
    def __init__(self, raw, head):
        super().__init__()
        self.raw, self.head = raw, head

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.head:
            count = min(len(buffer), len(self.head))
            buffer[:count] = self.head[:count]
            self.head = self.head[count:]
            return count
        return self.raw.readinto(buffer)

    def close(self):
        self.raw.close()   # the makefile's hold on the socket
        super().close()


class _RefusalResponse(http.client.HTTPResponse):
    """A final reply that came before the body was sent: the connection ends with it,
    whatever it says (the server may still wait for a body that never comes, or read
    our next request as that body)."""

    def begin(self):
        super().begin()
        self.will_close = True


def _refusal(conn, status_line):
    """The HTTPResponse of the final reply whose ``status_line`` was read already."""
    def response_class(sock, *args, **kwargs):
        return _RefusalResponse(_Replayed(sock, status_line), *args, **kwargs)

    conn.response_class = response_class
    try:
        return conn.getresponse()
    finally:
        del conn.response_class   # the class's own again
