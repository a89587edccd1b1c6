#!/usr/bin/env python3
"""Writes seeds for fuzz_ckpt_decode: checkpoint state sections as
cairn_ckpt_encode_state (store/checkpoint.c) writes them, and whole files
around them with a valid BLAKE2b-256 checksum, in the target's input layout
(see the header of fuzz/fuzz_ckpt_decode.c). Real files from a store are
added beside these by hand. Run from the repository root."""
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "integration"))
from wire import varint as _varint  # noqa: E402  LEB128, as the store writes it


def varint(v):
    return _varint(v & ((1 << 64) - 1))  # i64 fields (lease) as u64


def state(runs, last, keys):
    """runs: [(rev, idx)]; keys: [(key, cr, ver, lease, [(rev, tomb)])], sorted."""
    out = varint(len(runs))
    for r, i in runs:
        out += varint(r) + varint(i)
    out += varint(last) + varint(len(keys))
    prev = b""
    for k, cr, ver, lease, hist in keys:
        shared = 0
        while shared < min(len(prev), len(k)) and prev[shared] == k[shared]:
            shared += 1
        out += varint(shared) + varint(len(k) - shared) + k[shared:]
        out += varint(cr) + varint(ver) + varint(lease) + varint(len(hist))
        last_rev = 0
        for r, tomb in hist:
            out += varint((r - last_rev) << 1 | tomb)
            last_rev = r
        prev = k
    return out

def state_input(n, rev, st):
    return bytes([1]) + struct.pack(">II", n, rev) + st

def file_input(n, rev, compacted, doc, st, actor=b"\x01" * 16):
    fixed = actor + struct.pack(">QQQ", 0x8e9e05c52164694d, 0xcdf818194e3b4be0, n)
    fixed += b"\x22" * 32 + struct.pack(">qqQ", rev, compacted, len(doc))
    payload = fixed + doc + st
    hdr = b"cairnCKP" + struct.pack(">IQ", 1, len(payload))
    hdr += hashlib.blake2b(payload, digest_size=32).digest()
    return bytes([0]) + hdr + payload

keys = [
    (b"", 2, 1, 0, [(2, 0)]),
    (b"a", 3, 2, 0, [(3, 0), (4, 0)]),
    (b"ab", 5, 0, 0, [(5, 0), (6, 1)]),
    (b"abc", 7, 1, 1000, [(7, 0)]),
    (b"abd", 8, 3, -5, [(2, 0), (3, 1), (8, 0)]),
    (b"b\xff", 9, 1, 0, [(9, 0)]),
]
one_run = state([(2, 1)], 9, keys)
two_runs = state([(2, 1), (6, 8)], 9, keys)
empty = state([], 0, [])
seeds = {
    "state_one_run": state_input(12, 9, one_run),
    "state_two_runs": state_input(12, 9, two_runs),
    "state_empty": state_input(1, 1, empty),
    "state_prefixes": state_input(30, 20, state([(2, 1)], 20, [
        (b"key-%014d" % i, 2 + i, 1, 0, [(2 + i, 0)]) for i in range(19)])),
    "file_empty": file_input(1, 1, -1, b"doc-bytes", empty),
    "file_one_run": file_input(12, 9, 4, b"\x00" * 40, one_run),
    "file_bad_sum": file_input(12, 9, -1, b"", two_runs)[:-1] + b"\x00",
}
d = "fuzz/corpus/ckpt_decode"
os.makedirs(d, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
