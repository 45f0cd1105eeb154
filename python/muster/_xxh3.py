"""XXH3-64 with a seed (``XXH3_64bits_withSeed``), in pure Python.

The iteration algorithms of muster hash through XXH3-64, whose output has been
frozen since xxHash 0.8.0.  This is a direct port of the scalar code path of
xxhash.h, for every input length; :func:`hash64` is the 8-byte fast path that
the permutations use (``perm_hash64`` in src/core/perm.c).
"""
import struct

M64 = 0xFFFFFFFFFFFFFFFF
PRIME32_1 = 0x9E3779B1
PRIME32_2 = 0x85EBCA77
PRIME32_3 = 0xC2B2AE3D
PRIME64_1 = 0x9E3779B185EBCA87
PRIME64_2 = 0xC2B2AE3D27D4EB4F
PRIME64_3 = 0x165667B19E3779F9
PRIME64_4 = 0x85EBCA77C2B2AE63
PRIME64_5 = 0x27D4EB2F165667C5
PRIME_MX1 = 0x165667919E3779F9
PRIME_MX2 = 0x9FB21C651E98DF25

K_SECRET = bytes((
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
))
SECRET_SIZE_MIN = 136
STRIPE_LEN = 64
SECRET_CONSUME_RATE = 8
SECRET_LASTACC_START = 7
SECRET_MERGEACCS_START = 11
MIDSIZE_STARTOFFSET = 3
MIDSIZE_LASTOFFSET = 17


def _r64(b, off):
    return int.from_bytes(b[off:off + 8], "little")


def _r32(b, off):
    return int.from_bytes(b[off:off + 4], "little")


# 8-byte fast path constant: readLE64(secret+8) ^ readLE64(secret+16).
_BITFLIP_4TO8 = _r64(K_SECRET, 8) ^ _r64(K_SECRET, 16)


def _avalanche(h):
    h ^= h >> 37
    h = (h * PRIME_MX1) & M64
    return h ^ (h >> 32)


def _xxh64_avalanche(h):
    h ^= h >> 33
    h = (h * PRIME64_2) & M64
    h ^= h >> 29
    h = (h * PRIME64_3) & M64
    return h ^ (h >> 32)


def _rotl64(v, r):
    return ((v << r) | (v >> (64 - r))) & M64


def _rrmxmx(h, length):
    h ^= _rotl64(h, 49) ^ _rotl64(h, 24)
    h = (h * PRIME_MX2) & M64
    h ^= (h >> 35) + length
    h = (h * PRIME_MX2) & M64
    return h ^ (h >> 28)


def _mul128_fold64(a, b):
    p = a * b
    return (p & M64) ^ (p >> 64)


def _swap32(v):
    return int.from_bytes(v.to_bytes(4, "little"), "big")


def _swap64(v):
    return int.from_bytes(v.to_bytes(8, "little"), "big")


def hash64(value, seed):
    """XXH3_64bits_withSeed of the 8 little-endian bytes of ``value`` (perm_hash64)."""
    seed ^= _swap32(seed & 0xFFFFFFFF) << 32
    # input1 = low 32 bits, input2 = high 32 bits; input64 = input2 + (input1 << 32).
    keyed = (((value >> 32) & 0xFFFFFFFF) | ((value & 0xFFFFFFFF) << 32)) ^ ((_BITFLIP_4TO8 - seed) & M64)
    keyed ^= ((keyed << 49) | (keyed >> 15)) & M64 ^ ((keyed << 24) | (keyed >> 40)) & M64
    keyed = (keyed * PRIME_MX2) & M64
    keyed ^= (keyed >> 35) + 8
    keyed = (keyed * PRIME_MX2) & M64
    return keyed ^ (keyed >> 28)


def _len_1to3(data, secret, seed):
    n = len(data)
    c1, c2, c3 = data[0], data[n >> 1], data[n - 1]
    combined = (c1 << 16) | (c2 << 24) | c3 | (n << 8)
    bitflip = ((_r32(secret, 0) ^ _r32(secret, 4)) + seed) & M64
    return _xxh64_avalanche(combined ^ bitflip)


def _len_4to8(data, secret, seed):
    n = len(data)
    seed ^= _swap32(seed & 0xFFFFFFFF) << 32
    input1 = _r32(data, 0)
    input2 = _r32(data, n - 4)
    bitflip = ((_r64(secret, 8) ^ _r64(secret, 16)) - seed) & M64
    input64 = (input2 + (input1 << 32)) & M64
    return _rrmxmx(input64 ^ bitflip, n)


def _len_9to16(data, secret, seed):
    n = len(data)
    bitflip1 = ((_r64(secret, 24) ^ _r64(secret, 32)) + seed) & M64
    bitflip2 = ((_r64(secret, 40) ^ _r64(secret, 48)) - seed) & M64
    lo = _r64(data, 0) ^ bitflip1
    hi = _r64(data, n - 8) ^ bitflip2
    acc = (n + _swap64(lo) + hi + _mul128_fold64(lo, hi)) & M64
    return _avalanche(acc)


def _mix16(data, off, secret, soff, seed):
    lo = _r64(data, off)
    hi = _r64(data, off + 8)
    return _mul128_fold64(lo ^ ((_r64(secret, soff) + seed) & M64),
                          hi ^ ((_r64(secret, soff + 8) - seed) & M64))


def _len_17to128(data, secret, seed):
    n = len(data)
    acc = (n * PRIME64_1) & M64
    if n > 32:
        if n > 64:
            if n > 96:
                acc += _mix16(data, 48, secret, 96, seed)
                acc += _mix16(data, n - 64, secret, 112, seed)
            acc += _mix16(data, 32, secret, 64, seed)
            acc += _mix16(data, n - 48, secret, 80, seed)
        acc += _mix16(data, 16, secret, 32, seed)
        acc += _mix16(data, n - 32, secret, 48, seed)
    acc += _mix16(data, 0, secret, 0, seed)
    acc += _mix16(data, n - 16, secret, 16, seed)
    return _avalanche(acc & M64)


def _len_129to240(data, secret, seed):
    n = len(data)
    acc = (n * PRIME64_1) & M64
    rounds = n // 16
    for i in range(8):
        acc += _mix16(data, 16 * i, secret, 16 * i, seed)
    acc = _avalanche(acc & M64)
    for i in range(8, rounds):
        acc += _mix16(data, 16 * i, secret, 16 * (i - 8) + MIDSIZE_STARTOFFSET, seed)
    acc += _mix16(data, n - 16, secret, SECRET_SIZE_MIN - MIDSIZE_LASTOFFSET, seed)
    return _avalanche(acc & M64)


def _accumulate_512(acc, data, off, secret, soff):
    for i in range(8):
        val = _r64(data, off + 8 * i)
        key = val ^ _r64(secret, soff + 8 * i)
        acc[i ^ 1] = (acc[i ^ 1] + val) & M64
        acc[i] = (acc[i] + (key & 0xFFFFFFFF) * (key >> 32)) & M64


def _scramble(acc, secret, soff):
    for i in range(8):
        a = acc[i]
        a ^= a >> 47
        a ^= _r64(secret, soff + 8 * i)
        acc[i] = (a * PRIME32_1) & M64


def _hash_long(data, secret):
    n = len(data)
    ssize = len(secret)
    acc = [PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1]
    stripes_per_block = (ssize - STRIPE_LEN) // SECRET_CONSUME_RATE
    block_len = STRIPE_LEN * stripes_per_block
    nb_blocks = (n - 1) // block_len
    for b in range(nb_blocks):
        for s in range(stripes_per_block):
            _accumulate_512(acc, data, b * block_len + s * STRIPE_LEN, secret, s * SECRET_CONSUME_RATE)
        _scramble(acc, secret, ssize - STRIPE_LEN)
    nb_stripes = ((n - 1) - block_len * nb_blocks) // STRIPE_LEN
    for s in range(nb_stripes):
        _accumulate_512(acc, data, nb_blocks * block_len + s * STRIPE_LEN, secret, s * SECRET_CONSUME_RATE)
    _accumulate_512(acc, data, n - STRIPE_LEN, secret, ssize - STRIPE_LEN - SECRET_LASTACC_START)
    result = (n * PRIME64_1) & M64
    for i in range(4):
        so = SECRET_MERGEACCS_START + 16 * i
        result += _mul128_fold64(acc[2 * i] ^ _r64(secret, so), acc[2 * i + 1] ^ _r64(secret, so + 8))
    return _avalanche(result & M64)


def _custom_secret(seed):
    out = bytearray()
    for i in range(len(K_SECRET) // 16):
        lo = (_r64(K_SECRET, 16 * i) + seed) & M64
        hi = (_r64(K_SECRET, 16 * i + 8) - seed) & M64
        out += struct.pack("<QQ", lo, hi)
    return bytes(out)


def xxh3_64(data, seed=0):
    """XXH3_64bits_withSeed(data, len(data), seed) for any bytes-like ``data``."""
    data = bytes(data)
    seed &= M64
    n = len(data)
    secret = K_SECRET
    if n <= 16:
        if n > 8:
            return _len_9to16(data, secret, seed)
        if n >= 4:
            return _len_4to8(data, secret, seed)
        if n:
            return _len_1to3(data, secret, seed)
        return _xxh64_avalanche(seed ^ (_r64(secret, 56) ^ _r64(secret, 64)))
    if n <= 128:
        return _len_17to128(data, secret, seed)
    if n <= 240:
        return _len_129to240(data, secret, seed)
    return _hash_long(data, K_SECRET if seed == 0 else _custom_secret(seed))
