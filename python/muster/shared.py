"""``client.shared``: shared data (docs/api.md, "Shared data"), streamed.

Blob bytes travel raw.  Small ones may be given and read as bytes (``set``, ``get``);
large ones go from a file and to a file in pieces, so that memory does not grow with
the blob.  An upload from a file reads it as it is sent, with the Content-Length taken
from the file's size (sent chunked when the size cannot be known: a pipe, gzip.open's
file), and holds its last piece back until the file is seen to end there, so a file
that changes size while it is sent never completes the body and the head stores
nothing.  An upload over 64 KiB asks for ``100 Continue`` first (muster._continue), so
one the head refuses is refused before its bytes are sent.  A download (``get_to``)
writes the body as it arrives, hashed on the way (XXH64, the level's ETag), into a
temporary file beside the destination, which replaces the destination only once the
body is complete and matches its checksum.
"""
import errno
import http.client
import io
import json
import os
import stat
import urllib.parse

from . import _continue, _replace, errors
from ._xxh64 import hasher

PIECE_BYTES = 1 << 20  # read from a file, or from the connection, at a time


def _q(part):
    return urllib.parse.quote(str(part), safe="")


class _SourceFailed(Exception):
    """An upload's file failed while http.client sent it (it could not be read, or it
    changed size).  It carries the error out of the exchange, which takes OSErrors for
    the network's; Shared raises ``error`` itself."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def _check_file(file, argument, reading):
    """Refuses, before anything is sent, a file object that cannot give or take bytes:
    one opened in text mode (TypeError), a closed one or one not open for reading, or
    for writing (ValueError)."""
    mode = getattr(file, "mode", None)
    if isinstance(file, io.TextIOBase) or (isinstance(mode, str) and "b" not in mode):
        raise TypeError("%s: %r is open in text mode (%r); shared data are bytes: open it in "
                        "binary mode (%r)" % (argument, getattr(file, "name", file), mode,
                                              "rb" if reading else "wb"))
    if getattr(file, "closed", False):
        raise ValueError("%s: the file is closed" % argument)
    able = getattr(file, "readable" if reading else "writable", None)
    if able is not None and not able():
        raise ValueError("%s: the file is not open for %s" % (
            argument, "reading" if reading else "writing"))


def _position(file):
    """The file's position when it can seek (so it can be sent again from there), else
    None."""
    try:
        return file.tell() if file.seekable() else None
    except (AttributeError, OSError, ValueError):
        return None


def _size_left(file, start):
    """The bytes from ``start`` to the file's end, or None when that cannot be known in
    advance: a pipe or a socket, and a file object that is not open()'s nor a BytesIO
    (gzip.open's gives the bytes it decompresses, while its fileno() is the compressed
    file's).  Such a file is sent chunked."""
    if start is None:
        return None
    if isinstance(getattr(file, "raw", file), io.FileIO):  # open()'s: its bytes are its fd's
        try:
            st = os.fstat(file.fileno())
            if stat.S_ISREG(st.st_mode):
                return max(0, st.st_size - start)
        except (OSError, ValueError):
            pass
    elif not isinstance(file, io.BytesIO):
        return None
    end = file.seek(0, io.SEEK_END)
    file.seek(start)
    return max(0, end - start)


class _Upload:
    """The body of an upload from a binary file: the bytes from its position to its
    end, read as they are sent.  Calling it gives one attempt's pieces (a connection
    found closed is tried again, from the same position)."""

    def __init__(self, file, label):
        self.file, self.label = file, label
        self.start = _position(file)
        self.size = _size_left(file, self.start)
        self.read_any = False

    def headers(self):
        headers = _continue.expect_headers(self.size)
        if self.size is not None:
            headers["Content-Length"] = str(self.size)
        return headers

    def __call__(self):
        if self.start is not None:
            self.file.seek(self.start)
        elif self.read_any:
            raise errors.NetworkError("the connection closed while %s was sent, and a file "
                                      "that cannot seek cannot be sent again" % self.label)
        return self._sized() if self.size is not None else self._to_end()

    def _read(self, count):
        try:
            piece = self.file.read(count)
        except Exception as e:  # OSError; ValueError when it was closed meanwhile
            raise _SourceFailed(e) from e
        if piece and not isinstance(piece, (bytes, bytearray, memoryview)):
            raise _SourceFailed(TypeError("data: the file's read() gave %s, not bytes: open it "
                                          "in binary mode ('rb')" % type(piece).__name__))
        self.read_any = self.read_any or bool(piece)
        return piece or b""

    def _changed(self, ended_at):
        now = "ended after %d" % ended_at if ended_at is not None else "has more now"
        return _SourceFailed(OSError(
            "%s changed size while it was sent: it had %d bytes when the upload began and %s; "
            "nothing was stored (send it again once it no longer changes)"
            % (self.label, self.size, now)))

    def _sized(self):
        """The file's ``size`` bytes, the last piece held back until the file is seen
        to end there."""
        left, piece = self.size, b""
        while left:
            if piece:
                yield piece
            piece = self._read(min(PIECE_BYTES, left))
            if not piece:
                raise self._changed(self.size - left)
            left -= len(piece)
        if self._read(1):
            raise self._changed(None)
        if piece:
            yield piece

    def _to_end(self):
        while True:
            piece = self._read(PIECE_BYTES)
            if not piece:
                return
            yield piece


def _open_source(path, label):
    """The file at ``path`` opened for an upload; an error names the argument."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise OSError(e.errno, "data: cannot open the file to upload as %s (%s)"
                      % (label, e.strerror), os.fspath(path)) from None


def _read_piece(resp, label, size):
    try:
        return resp.read(PIECE_BYTES)
    except (OSError, http.client.HTTPException) as e:
        raise errors.NetworkError("%s: the body broke off after %d bytes: %s"
                                  % (label, size, e or type(e).__name__)) from e


def _read_body(resp, write, label):
    """Reads a reply's body to its end in pieces, each given to ``write``: (size, XXH64
    of the bytes in hex).  A body that ends short of its Content-Length raises
    NetworkError."""
    digest = hasher()
    size = 0
    try:
        while True:
            piece = _read_piece(resp, label, size)
            if not piece:
                break
            digest.update(piece)
            write(piece)
            size += len(piece)
        checksum = digest.hexdigest()
    finally:
        digest.close()
    length = resp.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) != size:
        raise errors.NetworkError("%s: the body ended after %d of its %s bytes (the connection "
                                  "closed early); read it again" % (label, size, length.strip()))
    return size, checksum


def _level_info(headers, size):
    """The level's info from the reply's headers (names in lower case)."""
    return {"level": int(headers.get("x-muster-level", "0") or 0),
            "etag": headers.get("etag", "").strip('"') or None,
            "expires_ms": int(headers.get("x-muster-expires-ms", "0") or 0) or None,
            "size": size}


def _verify(info, checksum, label):
    """Raises ProtocolError when the bytes read do not match the level's checksum (the
    ETag; a reply without one, from no muster head, is taken as it is, as libmuster
    does)."""
    if info["etag"] and info["etag"].lower() != checksum:
        raise errors.ProtocolError("the bytes of %s do not match their checksum (got %s, the "
                                   "head says %s); read them again"
                                   % (label, checksum, info["etag"]))


def _write_all(write):
    """``write`` (a file's) made to take every byte of each piece: a raw file's write may
    take part of one."""
    def write_all(piece):
        view = memoryview(piece)
        while view:
            written = write(view)
            if not isinstance(written, int) or written >= len(view):
                return  # all of it (a writer that returns no count is taken at its word)
            if written <= 0:
                raise OSError(errno.EIO, "dest: the file took none of the bytes written to it")
            view = view[written:]
    return write_all


class _Destination:
    """Where ``get_to`` writes: a binary file object, written as the bytes come; or a
    path, written through a temporary file beside the file it names (the same directory,
    so the same file system; a symbolic link followed) that replaces that file once the
    bytes are complete and verified, with its permission bits (muster._replace), and is
    removed otherwise; a path to a device or a FIFO is written into as the bytes come."""

    def __init__(self, dest, label):
        self.path = self.target = self.tmp = None
        if isinstance(dest, (str, bytes, os.PathLike)):
            self.path = os.fsdecode(dest)
            self.file = self._open_beside(label)
        elif hasattr(dest, "write"):
            _check_file(dest, "dest", reading=False)
            self.file = dest
        else:
            raise TypeError("dest: expected a path (str or os.PathLike) or a file open for "
                            "writing in binary mode, got %s" % type(dest).__name__)
        self.write = _write_all(self.file.write)

    def _open_beside(self, label):
        """The temporary file beside the file that ``path`` names (a symbolic link
        followed, as open() would: muster._replace), opened for writing; or that file
        itself when it is a device or a FIFO (``/dev/null``), which is written into."""
        if os.path.isdir(self.path):
            raise IsADirectoryError(errno.EISDIR, "dest: a directory; name the file to write "
                                    "%s to" % label, self.path)
        try:
            self.target = _replace.destination(self.path)
            if not _replace.written_into(self.target):
                fd, self.tmp = _replace.create_beside(self.target, ".part")
                return open(fd, "wb")
        except OSError as e:
            raise OSError(e.errno, "dest: cannot create a file beside it to download %s "
                          "into (%s)" % (label, e.strerror), self.path) from None
        try:
            return open(self.target, "wb")
        except OSError as e:
            raise OSError(e.errno, "dest: cannot open it to write %s into (%s)"
                          % (label, e.strerror), self.path) from None

    def commit(self):
        if self.tmp is None:   # a file object; or a device or a FIFO, written into
            if self.path is None:
                self.file.flush()
            else:
                self.file.close()
            return
        self.file.close()
        os.replace(self.tmp, self.target)
        self.tmp = None

    def discard(self):
        if self.tmp is None:
            if self.path is not None:   # a device or a FIFO: what came stays written
                try:
                    self.file.close()
                except OSError:
                    pass
            return
        try:
            self.file.close()
        except OSError:
            pass  # a full disk fails the flush: the file goes all the same
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass
        self.tmp = None


class Shared:
    """Shared data (docs/api.md, "Shared data"): versioned blobs ``(scope, name, level)``.

    ``client.shared.set(scope, name, data)`` creates level 1, ``update(scope, name, data,
    level)`` creates ``level`` (exactly the current level + 1, else ``VersionMismatch``);
    ``data`` is bytes, a str (sent as UTF-8 text), a path (``os.PathLike``: a
    ``pathlib.Path``) or a file open in binary mode, the last two sent in pieces.
    ``get(scope, name, level=None)`` returns the bytes (``SharedNotFound`` when missing or
    expired), ``get_to(scope, name, dest, level=None)`` writes them to a path or a binary
    file in pieces; both check them against the level's checksum.  ``delete`` removes
    every level, ``list(scope)`` the blobs of a scope.  ``scope`` is an open session's
    id (the blob goes with the session) or a global name.
    """

    def __init__(self, client):
        self._c = client

    def _path(self, scope, name=None):
        return "/v1/shared/" + _q(scope) + ("" if name is None else "/" + _q(name))

    def _body(self, data, label):
        """(body, headers, file to close afterwards) of ``set``'s ``data``."""
        if isinstance(data, str):
            data = data.encode()
        if isinstance(data, (bytes, bytearray, memoryview)):
            return data, _continue.expect_headers(memoryview(data).nbytes), None
        if isinstance(data, os.PathLike):
            file = _open_source(data, label)
            label = "%s (from %s)" % (label, os.fspath(data))
        elif hasattr(data, "read"):
            _check_file(data, "data", reading=True)
            file = None
        else:
            # bytes(5) would be five zero bytes, bytes({...}) a puzzling TypeError
            raise TypeError("data: expected bytes (or str), a path (os.PathLike) or a file open "
                            "in binary mode, got %s (for %s); serialise it first (pickle.dumps, "
                            "json.dumps(...).encode())" % (type(data).__name__, label))
        try:
            upload = _Upload(file or data, label)
        except BaseException:
            if file is not None:
                file.close()
            raise
        return upload, upload.headers(), file

    def set(self, scope, name, data, ttl_ms=None, level=None):
        """Creates the blob at level 1 (or ``level``); returns the reply object.  ``data``
        is bytes (or a bytes-like object, or a str sent as UTF-8 text), a path
        (``os.PathLike``, such as a ``pathlib.Path``: a str is text, never a path) or a
        file open in binary mode (sent from its position to its end); a file is read
        as it is sent, never whole."""
        label = "shared data %r in scope %r" % (name, scope)
        body, headers, opened = self._body(data, label)
        try:
            _, _, raw = self._c.request_raw("PUT", self._path(scope, name), body,
                                            query={"level": level, "ttl_ms": ttl_ms},
                                            headers=headers)
        except _SourceFailed as e:
            raise e.error from None
        finally:
            if opened is not None:
                opened.close()
        return json.loads(raw) if raw else None

    def update(self, scope, name, data, level, ttl_ms=None):
        """Creates level ``level`` (the current level + 1); ``data`` as for ``set``."""
        return self.set(scope, name, data, ttl_ms=ttl_ms, level=level)

    def get(self, scope, name, level=None, with_info=False):
        """The bytes of the newest level (or of ``level``), checked against its checksum;
        with ``with_info`` also ``{"level", "etag", "expires_ms", "size"}``.  Read as
        ``get_to`` reads them, so a body cut short or a reply that is not the bytes
        raises as it does."""
        body = io.BytesIO()
        info = self._fetch(scope, name, level, body.write,
                           "shared data %r in scope %r" % (name, scope))
        raw = body.getvalue()
        return (raw, info) if with_info else raw

    def get_to(self, scope, name, dest, level=None):
        """Writes the bytes of the newest level (or of ``level``) to ``dest`` as they
        arrive, never holding them whole, and checks them against the level's checksum;
        returns ``{"level", "etag", "expires_ms", "size"}``.  ``dest`` is a path (str or
        ``os.PathLike``), written through a temporary file beside it that replaces it
        only once the bytes are complete and verified, so a failed download leaves the
        path as it was; or a file open for writing in binary mode, written from its
        position (after a failure it holds what came)."""
        label = "shared data %r in scope %r" % (name, scope)
        sink = _Destination(dest, label)
        try:
            info = self._fetch(scope, name, level, sink.write, label)
            sink.commit()
        except BaseException:
            sink.discard()
            raise
        return info

    def _fetch(self, scope, name, level, write, label):
        """One streamed GET of the level into ``write``: its info, the bytes verified."""
        resp, raw = self._c._send_raw("GET", self._path(scope, name), query={"level": level},
                                      stream=True)
        if raw is not None:  # a 3xx: no level's bytes
            raise errors.ProtocolError("%s: the server answered HTTP %d, not the bytes"
                                       % (label, resp.status), status=resp.status)
        try:
            size, checksum = _read_body(resp, write, label)
        except BaseException:
            self._c._drop_connection(lost=True)  # the rest of the body is still owed
            raise
        self._c._reply_read(resp)
        info = _level_info({k.lower(): v for k, v in resp.getheaders()}, size)
        _verify(info, checksum, label)
        return info

    def list(self, scope):
        return self._c.request("GET", self._path(scope))["blobs"]

    def delete(self, scope, name):
        return self._c.request("DELETE", self._path(scope, name))

    def available(self):
        """False while the head has no shared-data API (it answers a bare ``not_found``)."""
        try:
            self._c.request("GET", self._path("muster-probe"))
        except errors.MusterError as e:
            return e.code not in ("not_found", "method_not_allowed")
        return True
