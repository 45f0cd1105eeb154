"""XXH64, streamed: the checksum of a shared-data level (its ``ETag``).

The head hashes every level with ``XXH64`` (seed 0) and sends the 16 hex digits as
the level's ``ETag``; a download is checked against it as its pieces arrive, never
held whole.  :func:`hasher` gives libxxhash's (through ctypes, where the library is
installed, as it is wherever muster is built) and else :class:`XXH64`, the same
function in pure Python: a port of the scalar code of xxhash.h, about 40 MiB/s where
libxxhash hashes gigabytes a second.
"""
import struct
import threading

from ._xxh3 import M64, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME64_5

STRIPE_LEN = 32
# The stripes of one update are read in blocks of this many bytes: the integers of a
# block exist at once, so a large piece does not turn into a larger heap of them.
BLOCK_LEN = 64 * 1024
_LIBRARY_NAMES = ("libxxhash.so.0", "libxxhash.0.dylib", "libxxhash.dylib", "libxxhash.so")
_library = None  # libxxhash once looked for: the CDLL, or False when there is none
_library_lock = threading.Lock()  # held while it is looked for


def _round(acc, lane):
    acc = (acc + lane * PRIME64_2) & M64
    return ((acc << 31 | acc >> 33) & M64) * PRIME64_1 & M64


def _rotl(value, bits):
    return (value << bits | value >> (64 - bits)) & M64


def _stripes(lanes, data, end):
    """The four accumulators after the stripes of ``data[:end]`` (``end`` a multiple
    of STRIPE_LEN), read in blocks of BLOCK_LEN."""
    v1, v2, v3, v4 = lanes
    for start in range(0, end, BLOCK_LEN):
        count = min(BLOCK_LEN, end - start) // 8
        words = iter(struct.unpack_from("<%dQ" % count, data, start))
        for a, b, c, d in zip(words, words, words, words):
            v1 = (v1 + a * PRIME64_2) & M64
            v1 = ((v1 << 31 | v1 >> 33) & M64) * PRIME64_1 & M64
            v2 = (v2 + b * PRIME64_2) & M64
            v2 = ((v2 << 31 | v2 >> 33) & M64) * PRIME64_1 & M64
            v3 = (v3 + c * PRIME64_2) & M64
            v3 = ((v3 << 31 | v3 >> 33) & M64) * PRIME64_1 & M64
            v4 = (v4 + d * PRIME64_2) & M64
            v4 = ((v4 << 31 | v4 >> 33) & M64) * PRIME64_1 & M64
    return v1, v2, v3, v4


def _merge(acc, lane):
    acc ^= _round(0, lane)
    return (acc * PRIME64_1 + PRIME64_4) & M64


def _tail(h, rest):
    """XXH64_finalize: ``h`` after the last 0 to 31 bytes, avalanched."""
    at = 0
    while len(rest) - at >= 8:
        h ^= _round(0, int.from_bytes(rest[at:at + 8], "little"))
        h = (_rotl(h, 27) * PRIME64_1 + PRIME64_4) & M64
        at += 8
    if len(rest) - at >= 4:
        h ^= int.from_bytes(rest[at:at + 4], "little") * PRIME64_1 & M64
        h = (_rotl(h, 23) * PRIME64_2 + PRIME64_3) & M64
        at += 4
    for byte in rest[at:]:
        h ^= byte * PRIME64_5 & M64
        h = _rotl(h, 11) * PRIME64_1 & M64
    h ^= h >> 33
    h = h * PRIME64_2 & M64
    h ^= h >> 29
    h = h * PRIME64_3 & M64
    return h ^ (h >> 32)


class XXH64:
    """XXH64 of the bytes given to :meth:`update`, piece by piece (pure Python)."""

    def __init__(self, seed=0):
        self._seed = seed & M64
        self._lanes = ((seed + PRIME64_1 + PRIME64_2) & M64, (seed + PRIME64_2) & M64,
                       seed & M64, (seed - PRIME64_1) & M64)
        self._rest = b""  # the bytes after the last whole stripe
        self._total = 0

    def update(self, data):
        data = self._rest + bytes(data) if self._rest else bytes(data)
        self._total += len(data) - len(self._rest)
        whole = len(data) - len(data) % STRIPE_LEN
        if whole:
            self._lanes = _stripes(self._lanes, data, whole)
        self._rest = data[whole:]

    def intdigest(self):
        if self._total >= STRIPE_LEN:
            v1, v2, v3, v4 = self._lanes
            h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & M64
            for lane in self._lanes:
                h = _merge(h, lane)
        else:
            h = (self._seed + PRIME64_5) & M64
        return _tail((h + self._total) & M64, self._rest)

    def hexdigest(self):
        return "%016x" % self.intdigest()

    def close(self):
        pass


def _find_library():
    """libxxhash with the prototypes of XXH64's streaming calls, or False."""
    try:
        import ctypes
    except ImportError:  # an interpreter built without it
        return False
    for name in _LIBRARY_NAMES:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.XXH64_createState.restype = ctypes.c_void_p
        lib.XXH64_freeState.argtypes = [ctypes.c_void_p]
        lib.XXH64_reset.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.XXH64_update.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.XXH64_digest.argtypes = [ctypes.c_void_p]
        lib.XXH64_digest.restype = ctypes.c_uint64
        return lib
    return False


def _load_library():
    """libxxhash (looked for once), or None.  A thread that asks while another looks
    waits for its answer: it would otherwise hash in pure Python."""
    global _library
    if _library is None:
        with _library_lock:
            if _library is None:
                _library = _find_library()
    return _library or None


class _LibXXH64:
    """XXH64 of the bytes given to :meth:`update`, by libxxhash."""

    def __init__(self, lib, seed=0):
        self._lib = lib
        self._state = lib.XXH64_createState()
        if not self._state:
            raise MemoryError("XXH64_createState")
        lib.XXH64_reset(self._state, seed)

    def update(self, data):
        data = bytes(data)  # its len() counts bytes; a memoryview's may count items
        self._lib.XXH64_update(self._state, data, len(data))

    def intdigest(self):
        return self._lib.XXH64_digest(self._state)

    def hexdigest(self):
        return "%016x" % self.intdigest()

    def close(self):
        if self._state:
            self._lib.XXH64_freeState(self._state)
            self._state = None

    __del__ = close


def hasher(seed=0):
    """A new XXH64 state: libxxhash's where it can be loaded, else :class:`XXH64`.
    Either has ``update(bytes)``, ``intdigest()``, ``hexdigest()`` and ``close()``."""
    lib = _load_library()
    return _LibXXH64(lib, seed) if lib else XXH64(seed)
