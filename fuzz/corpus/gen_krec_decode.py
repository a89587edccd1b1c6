#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_krec_decode: history records as batch_change
(store/store.c) writes them, in the target's input layout (see the header of
fuzz/fuzz_krec_decode.c). Run from the repository root."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "integration"))
from wire import varint  # noqa: E402  LEB128, as the store writes it

def rec(flags, sub, cr, ver, lease, pos=None, val=b""):
    r = bytes([flags]) + varint(sub) + varint(cr) + varint(ver) + varint(lease)
    if pos is not None:
        r += varint(pos)
    return r + val

def inp(kvs, key, record, body=b""):
    return bytes([kvs, len(key)]) + key + bytes([len(record)]) + record + body

d = "fuzz/corpus/krec_decode"
os.makedirs(d, exist_ok=True)
seeds = {
    "inline": inp(2, b"a", rec(0, 0, 5, 1, 0, val=b"v1")),
    "inline_empty": inp(2, b"", rec(0, 3, 1, 1, 0)),
    "tombstone": inp(2, b"b", rec(1, 1, 0, 0, 0)),
    "body_a": inp(2, b"a", rec(2, 0, 5, 1, 0, pos=0)),
    "body_k_lease": inp(2, b"k", rec(2, 1, 300, 2, 0x694D7A3B1C2E, pos=2)),
    "body_del_op": inp(2, b"b", rec(2, 0, 9, 1, 0, pos=1)),
    "body_other_map": inp(2, b"a", rec(2, 0, 9, 1, 0, pos=3)),
    "body_past_end": inp(2, b"a", rec(2, 0, 9, 1, 0, pos=6)),
    "body_int_value": inp(2, b"", rec(2, 0, 9, 1, 0, pos=5)),
    "cr_over_int64": inp(2, b"a", rec(0, 0, 1 << 63, 1, 0, val=b"v")),
    "ver_max_int64": inp(2, b"a", rec(0, 0, 1, (1 << 63) - 1, 0, val=b"v")),
}
# Real change bodies from the change decoder's corpus, referenced at op 0.
src = "fuzz/corpus/change_decode"
for name in sorted(os.listdir(src))[:4]:
    with open(os.path.join(src, name), "rb") as f:
        body = f.read()
    seeds["body_real_" + name[:8]] = inp(1, b"k", rec(2, 0, 2, 1, 0, pos=0), body)
for name, data in seeds.items():
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
