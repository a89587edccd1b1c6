"""The KV conformance checks: Range, Put, DeleteRange, Txn, Compact.

Each check gets a context `c` (harness.Ctx) whose keys live in a namespace of
their own ("/<check name>/"; results show them as "~key"), and whose
revisions are shown relative to the revision at the check's start ("r+2"),
except in the suite "fresh", which runs first on a new server and keeps
absolute revisions. A check returns whatever it wants compared: usually the
normalised responses of the calls it made, and the revision afterwards.

No expected value is written here. What etcd answers is the expectation; the
checks were shaped by running them against etcd 3.4 and reading the answers
(see ETCD-MEASURED.md). Suites run on separate fresh servers, in this order.
"""

CHECKS = []     # (suite, name, fn), in definition order
SUITES = []     # suite names, in order of first use
PREFIX = object()   # range_end marker: the prefix end of the key
FROMKEY = b"\x00"   # range_end "\0": every key >= key


class Abs(int):
    """A compare operand taken as is, not relative to the check's start."""


def check(suite, name):
    def deco(fn):
        if any(n == name for _s, n, _f in CHECKS):
            raise ValueError("duplicate check name " + name)
        CHECKS.append((suite, name, fn))
        if suite not in SUITES:
            SUITES.append(suite)
        return fn
    return deco


def keys(resp):
    """A Range answer in short: keys, more, count (or the error)."""
    if "error" in resp:
        return resp
    return {"keys": [kv["key"] for kv in resp.get("kvs", [])],
            "more": resp.get("more", False), "count": resp.get("count", 0)}


def ok(resp):
    """A Txn answer in short: which branch ran, or the error."""
    if "error" in resp:
        return resp["error"]
    return resp["succeeded"]


# ==========================================================================
# fresh: a new server, absolute revisions, the whole key space

@check("fresh", "fresh.revision_at_start")
def _(c):
    return {"range_header": c.range(b"anything")["header"]}


@check("fresh", "fresh.range_all_empty_store")
def _(c):
    return c.range(b"\x00", end=FROMKEY)


@check("fresh", "fresh.first_put")
def _(c):
    return [c.put("a", "1"), c.range("a")]


@check("fresh", "fresh.range_fromkey_all")
def _(c):
    c.put("b", "2")
    c.put("c", "3")
    return [keys(c.range(b"\x00", end=FROMKEY)),
            keys(c.range("b", end=FROMKEY)),
            keys(c.range(b"\xff", end=FROMKEY))]


@check("fresh", "fresh.range_fromkey_count_limit")
def _(c):
    return [c.range(b"\x00", end=FROMKEY, count_only=True),
            keys(c.range(b"\x00", end=FROMKEY, limit=1))]


@check("fresh", "fresh.range_fromkey_sorted_desc")
def _(c):
    return keys(c.range(b"\x00", end=FROMKEY, sort_order="DESCEND"))


@check("fresh", "fresh.delete_fromkey_partial")
def _(c):
    c.put("x1", "1")
    c.put("x2", "2")
    return [c.delete("x2", end=FROMKEY, prev_kv=True),
            keys(c.range(b"\x00", end=FROMKEY))]


@check("fresh", "fresh.delete_all_fromkey")
def _(c):
    return [c.delete(b"\x00", end=FROMKEY, prev_kv=True), c.rev(),
            c.range(b"\x00", end=FROMKEY)]


@check("fresh", "fresh.delete_all_again_nothing")
def _(c):
    return [c.delete(b"\x00", end=FROMKEY), c.rev()]


@check("fresh", "fresh.put_after_delete_all")
def _(c):
    return [c.put("a", "x"), c.range("a")]


# ==========================================================================
# rev: revision numbering

@check("kv", "rev.put_increments_by_one")
def _(c):
    return [c.put("a", "1")["header"], c.put("b", "2")["header"],
            c.put("a", "3")["header"], c.rev()]


@check("kv", "rev.reads_take_none")
def _(c):
    c.put("a", "1")
    c.range("a")
    c.range("a", end=PREFIX)
    c.range("zzz")
    return c.rev()


@check("kv", "rev.delete_of_nothing_takes_none")
def _(c):
    return [c.delete("missing"), c.delete("m", end=PREFIX), c.rev()]


@check("kv", "rev.failed_put_takes_none")
def _(c):
    return [c.put(b"", "v"), c.put("k", "v", ignore_value=True), c.rev()]


@check("kv", "rev.delete_takes_one")
def _(c):
    c.put("a", "1")
    return [c.delete("a"), c.rev()]


@check("kv", "rev.delete_range_takes_one")
def _(c):
    for k in ("p/1", "p/2", "p/3"):
        c.put(k, k)
    return [c.delete("p/", end=PREFIX), c.rev()]


# ==========================================================================
# put

@check("kv", "put.create_mod_version")
def _(c):
    c.put("a", "1")
    c.put("b", "x")
    c.put("a", "2")
    c.put("a", "3")
    return c.range("a")


@check("kv", "put.prev_kv")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    return c.put("a", "3", prev_kv=True)


@check("kv", "put.prev_kv_of_new_key")
def _(c):
    return c.put("a", "1", prev_kv=True)


@check("kv", "put.version_reset_by_delete")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    c.delete("a")
    return [c.put("a", "3", prev_kv=True), c.range("a")]


@check("kv", "put.empty_key")
def _(c):
    return [c.put(b"", "v"), c.rev()]


@check("kv", "put.empty_value")
def _(c):
    return [c.put("a", ""), c.range("a")]


@check("kv", "put.binary_key_and_value")
def _(c):
    k = c.key("b") + b"\x00\xff\x01"
    return [c.put(k, b"\x00\xfe"), c.range(k), keys(c.range("b", end=PREFIX))]


@check("kv", "put.ignore_value")
def _(c):
    c.put("a", "1")
    return [c.put("a", ignore_value=True, prev_kv=True), c.range("a")]


@check("kv", "put.ignore_value_with_value")
def _(c):
    c.put("a", "1")
    return [c.put("a", "2", ignore_value=True), c.range("a")]


@check("kv", "put.ignore_value_missing_key")
def _(c):
    return [c.put("a", ignore_value=True), c.rev()]


@check("kv", "put.ignore_value_deleted_key")
def _(c):
    c.put("a", "1")
    c.delete("a")
    return [c.put("a", ignore_value=True), c.rev()]


@check("kv", "put.lease_field")
def _(c):
    lid = c.grant()
    return [c.put("a", "1", lease=lid), c.range("a"), c.rev()]


@check("kv", "put.unknown_lease")
def _(c):
    return [c.put("a", "1", lease=0x7e57000000000001), c.range("a"), c.rev()]


@check("kv", "put.plain_put_drops_lease")
def _(c):
    lid = c.grant()
    c.put("a", "1", lease=lid)
    return [c.put("a", "2", prev_kv=True), c.range("a")]


@check("kv", "put.ignore_lease")
def _(c):
    lid = c.grant()
    c.put("a", "1", lease=lid)
    return [c.put("a", "2", ignore_lease=True, prev_kv=True), c.range("a")]


@check("kv", "put.ignore_lease_with_lease")
def _(c):
    lid = c.grant()
    c.put("a", "1", lease=lid)
    return [c.put("a", "2", lease=lid, ignore_lease=True), c.range("a"), c.rev()]


@check("kv", "put.ignore_lease_missing_key")
def _(c):
    return [c.put("a", "1", ignore_lease=True), c.rev()]


@check("kv", "put.ignore_value_and_lease")
def _(c):
    lid = c.grant()
    c.put("a", "1", lease=lid)
    return [c.put("a", ignore_value=True, ignore_lease=True), c.range("a")]


@check("kv", "put.one_mib_value")
def _(c):
    v = bytes(range(256)) * 4096
    return [c.put("big", v)["header"], c.range("big")]


# ==========================================================================
# lease: only what the KV checks lean on

@check("kv", "lease.grant_takes_no_revision")
def _(c):
    c.grant()
    return c.rev()


@check("kv", "lease.revoke_deletes_keys_in_one_revision")
def _(c):
    lid = c.grant()
    c.put("a", "1", lease=lid)
    c.put("b", "2", lease=lid)
    c.put("c", "3")
    return [c.revoke(lid), c.rev(), keys(c.range("", end=PREFIX))]


@check("kv", "lease.revoke_without_keys_takes_no_revision")
def _(c):
    lid = c.grant()
    return [c.revoke(lid), c.rev()]


# ==========================================================================
# range

def _abc(c):
    for k in ("a", "ab", "abc", "b", "ba", "c"):
        c.put(k, "v-" + k)


@check("kv", "range.single_key")
def _(c):
    _abc(c)
    return c.range("ab")


@check("kv", "range.missing_key")
def _(c):
    _abc(c)
    return c.range("zz")


@check("kv", "range.prefix")
def _(c):
    _abc(c)
    return c.range("a", end=PREFIX)


@check("kv", "range.interval_end_exclusive")
def _(c):
    _abc(c)
    return keys(c.range("ab", end="ba"))


@check("kv", "range.end_before_key")
def _(c):
    _abc(c)
    return c.range("b", end="a")


@check("kv", "range.end_equal_key")
def _(c):
    _abc(c)
    return c.range("b", end="b")


@check("kv", "range.empty_key")
def _(c):
    return [c.range(b""), c.range(b"", end="x")]


@check("kv", "range.limit_more_count")
def _(c):
    _abc(c)
    return c.range("", end=PREFIX, limit=2)


@check("kv", "range.limit_equal_to_count")
def _(c):
    _abc(c)
    return keys(c.range("", end=PREFIX, limit=6))


@check("kv", "range.limit_above_count")
def _(c):
    _abc(c)
    return keys(c.range("", end=PREFIX, limit=100))


@check("kv", "range.limit_negative")
def _(c):
    _abc(c)
    return keys(c.range("", end=PREFIX, limit=-1))


@check("kv", "range.count_only")
def _(c):
    _abc(c)
    return [c.range("a", end=PREFIX, count_only=True),
            c.range("a", end=PREFIX, count_only=True, limit=1)]


@check("kv", "range.keys_only")
def _(c):
    _abc(c)
    return c.range("a", end=PREFIX, keys_only=True)


@check("kv", "range.keys_only_and_count_only")
def _(c):
    _abc(c)
    return c.range("a", end=PREFIX, keys_only=True, count_only=True)


@check("kv", "range.serializable")
def _(c):
    _abc(c)
    return c.range("a", end=PREFIX, serializable=True)


@check("kv", "range.historical")
def _(c):
    c.put("a", "1")                # r+1
    c.put("a", "2")                # r+2
    c.put("b", "1")                # r+3
    c.delete("a")                  # r+4
    c.put("a", "3")                # r+5
    return [c.range("a", rev=r) for r in (1, 2, 3, 4, 5)]


@check("kv", "range.historical_prefix_count")
def _(c):
    c.put("p/1", "1")              # r+1
    c.put("p/2", "2")              # r+2
    c.put("p/3", "3")              # r+3
    c.delete("p/2")                # r+4
    return [keys(c.range("p/", end=PREFIX, rev=r)) for r in (0, 1, 2, 3, 4)]


@check("kv", "range.historical_before_key_existed")
def _(c):
    c.put("a", "1")
    return c.range("a", rev=0)


@check("kv", "range.revision_current")
def _(c):
    c.put("a", "1")
    return c.range("a", rev=1)


@check("kv", "range.revision_future")
def _(c):
    c.put("a", "1")
    return [c.range("a", rev=2), c.range("a", rev=1000)]


@check("kv", "range.revision_negative")
def _(c):
    c.put("a", "1")
    return c.range("a", absrev=-1)


def _mods(c):
    c.put("a", "1")    # r+1  a create 1
    c.put("b", "1")    # r+2  b create 2
    c.put("c", "1")    # r+3  c create 3
    c.put("a", "2")    # r+4  a mod 4
    c.put("d", "1")    # r+5  d create 5


@check("kv", "range.min_mod_revision")
def _(c):
    _mods(c)
    return c.range("", end=PREFIX, min_mod=3)


@check("kv", "range.max_mod_revision")
def _(c):
    _mods(c)
    return c.range("", end=PREFIX, max_mod=3)


@check("kv", "range.min_create_revision")
def _(c):
    _mods(c)
    return c.range("", end=PREFIX, min_create=3)


@check("kv", "range.max_create_revision")
def _(c):
    _mods(c)
    return c.range("", end=PREFIX, max_create=2)


@check("kv", "range.mod_create_filters_with_limit")
def _(c):
    _mods(c)
    return [keys(c.range("", end=PREFIX, min_mod=2, limit=2)),
            keys(c.range("", end=PREFIX, min_create=2, max_create=3, limit=1))]


@check("kv", "range.filters_more_after_filtering")
def _(c):
    _mods(c)
    return [c.range("", end=PREFIX, min_create=3, max_create=3, limit=1),
            keys(c.range("", end=PREFIX, min_mod=4, limit=1)),
            keys(c.range("", end=PREFIX, min_mod=4, limit=2))]


@check("kv", "range.filters_with_count_only")
def _(c):
    _mods(c)
    return c.range("", end=PREFIX, min_mod=4, count_only=True)


# Sort data: every target orders the four keys differently.
#   key      a  b  c  d   ->  a b c d
#   version  3  1  2  4   ->  b c a d
#   create   2  4  1  3   ->  c a d b
#   mod      9  4 10  7   ->  b d a c
#   value    3  1  0  2   ->  c b d a
def _sortdata(c):
    c.put("c", "0")   # 1
    c.put("a", "3")   # 2
    c.put("d", "2")   # 3
    c.put("b", "1")   # 4
    c.put("d", "2")   # 5
    c.put("d", "2")   # 6
    c.put("d", "2")   # 7
    c.put("a", "3")   # 8
    c.put("a", "3")   # 9
    c.put("c", "0")   # 10


for _target in ("KEY", "VERSION", "CREATE", "MOD", "VALUE"):
    for _order in ("ASCEND", "DESCEND", "NONE"):
        def _mk(target, order):
            def fn(c):
                _sortdata(c)
                return keys(c.range("", end=PREFIX, sort_target=target, sort_order=order))
            return fn
        check("kv", "range.sort.%s.%s" % (_target.lower(), _order.lower()))(
            _mk(_target, _order))


for _target, _order in (("KEY", "ASCEND"), ("KEY", "DESCEND"), ("KEY", "NONE"),
                        ("VERSION", "ASCEND"), ("MOD", "DESCEND"),
                        ("VALUE", "NONE"), ("CREATE", "DESCEND")):
    def _mkl(target, order):
        def fn(c):
            _sortdata(c)
            return keys(c.range("", end=PREFIX, sort_target=target, sort_order=order,
                                limit=2))
        return fn
    check("kv", "range.sort_limit.%s.%s" % (_target.lower(), _order.lower()))(
        _mkl(_target, _order))


@check("kv", "range.sort_keys_only_and_history")
def _(c):
    _sortdata(c)
    return [keys(c.range("", end=PREFIX, sort_target="VERSION", sort_order="DESCEND",
                         keys_only=True)),
            keys(c.range("", end=PREFIX, sort_target="MOD", sort_order="ASCEND",
                         rev=6))]


@check("kv", "range.unsigned_byte_order")
def _(c):
    for suffix in (b"\x7f", b"\x80", b"\xff", b"\x01", b"A", b"\xc3\xa9"):
        c.put(c.key("u") + suffix, "v")
    return [keys(c.range("u", end=PREFIX)),
            keys(c.range("u", end=PREFIX, sort_order="DESCEND")),
            keys(c.range(c.key("u") + b"\x80", end=PREFIX))]


@check("kv", "range.prefix_ending_in_ff")
def _(c):
    c.put(c.key("a") + b"\xff", "1")
    c.put(c.key("a") + b"\xff\x00", "2")
    c.put(c.key("a") + b"\xff\xff", "3")
    c.put("b", "4")
    return [keys(c.range(c.key("a") + b"\xff", end=PREFIX)),
            keys(c.range(c.key("a") + b"\xff\xff", end=PREFIX))]


@check("kv", "range.historical_with_limit_and_count")
def _(c):
    for i in range(5):
        c.put("k%d" % i, "v")            # r+1 .. r+5
    c.delete("k1")                       # r+6
    return [c.range("", end=PREFIX, rev=3, limit=2),
            keys(c.range("", end=PREFIX, rev=6, limit=2)),
            c.range("", end=PREFIX, rev=4, count_only=True)]


@check("kv", "range.sort_ties_keep_key_order")
def _(c):
    # Few keys only: etcd's Go sort keeps ties in key order (both
    # directions) below 13 elements; above, its tie order is arbitrary.
    for k in ("d", "b", "a", "c"):
        c.put(k, "same")
    return [keys(c.range("", end=PREFIX, sort_target="VALUE", sort_order="ASCEND")),
            keys(c.range("", end=PREFIX, sort_target="VALUE", sort_order="DESCEND")),
            keys(c.range("", end=PREFIX, sort_target="VERSION", sort_order="DESCEND"))]


@check("kv", "put.same_value_still_writes")
def _(c):
    c.put("a", "1")
    return [c.put("a", "1", prev_kv=True), c.range("a")]


@check("kv", "put.many_keys_count_and_limit")
def _(c):
    c.txn(success=[c.op_put("k%03d" % i, str(i)) for i in range(100)])
    c.txn(success=[c.op_put("k%03d" % i, str(i)) for i in range(100, 200)])
    return [keys(c.range("k1", end=PREFIX, limit=3)),
            c.range("", end=PREFIX, count_only=True),
            keys(c.range("", end=PREFIX, sort_target="VALUE", sort_order="DESCEND", limit=2))]


@check("kv", "put.key_nul_byte")
def _(c):
    k = b"\x00" + c.key("nul")
    return [c.put(b"\x00", "zero")["header"], c.range(b"\x00"), c.put(k, "1")["header"],
            keys(c.range(b"\x00", end=b"\x00\x01")), c.delete(b"\x00", prev_kv=True),
            c.delete(k)]


@check("kv", "put.large_key")
def _(c):
    k = c.key("k") + b"x" * (64 * 1024)
    return [c.put(k, "v")["header"], c.range(k, keys_only=True), c.rev()]


@check("kv", "range.unknown_sort_order")
def _(c):
    # Only unknown orders: etcd 3.4 panics (nil dereference, the process
    # dies) on a sort_target outside 0..4, so there is nothing to compare.
    _sortdata(c)
    out = []
    for order, target in ((7, 0), (7, 4), (-1, 1), (3, 2)):
        r = c.range_req("", end=PREFIX)
        r.sort_order = order
        r.sort_target = target
        out.append(keys(c.call("/etcdserverpb.KV/Range", r, "RangeResponse")))
    return out


# ==========================================================================
# delete

@check("kv", "delete.single_prev_kv")
def _(c):
    c.put("a", "1")
    c.put("a", "2")
    return [c.delete("a", prev_kv=True), c.range("a"), c.rev()]


@check("kv", "delete.single_without_prev_kv")
def _(c):
    c.put("a", "1")
    return c.delete("a")


@check("kv", "delete.prefix_prev_kv")
def _(c):
    _abc(c)
    return [c.delete("a", end=PREFIX, prev_kv=True), keys(c.range("", end=PREFIX)),
            c.rev()]


@check("kv", "delete.interval")
def _(c):
    _abc(c)
    return [c.delete("ab", end="ba"), keys(c.range("", end=PREFIX))]


@check("kv", "delete.missing_key")
def _(c):
    return [c.delete("a", prev_kv=True), c.rev()]


@check("kv", "delete.empty_key")
def _(c):
    return [c.delete(b""), c.rev()]


@check("kv", "delete.history_still_readable")
def _(c):
    c.put("a", "1")
    c.delete("a")
    return [c.range("a", rev=1), c.range("a", rev=2), c.range("a")]


# ==========================================================================
# txn: revisions, branches, reads of own writes, nesting

@check("txn", "txn.empty")
def _(c):
    return [c.txn(), c.rev()]


@check("txn", "txn.read_only_takes_no_revision")
def _(c):
    c.put("a", "1")
    return [c.txn(success=[c.op_range("a"), c.op_range("b")]), c.rev()]


@check("txn", "txn.writes_share_one_revision")
def _(c):
    r = c.txn(success=[c.op_put("a", "1"), c.op_put("b", "2"), c.op_put("c", "3")])
    return [r, c.rev(), c.range("", end=PREFIX)]


@check("txn", "txn.atomic_at_its_revision")
def _(c):
    c.put("p/0", "0")                                                   # r+1
    c.txn(success=[c.op_put("p/1", "1"), c.op_put("p/2", "2"),
                   c.op_del("p/0")])                                    # r+2
    c.put("p/3", "3")                                                   # r+3
    return [keys(c.range("p/", end=PREFIX, rev=r)) for r in (1, 2, 3)]


@check("txn", "txn.put_and_delete_one_revision")
def _(c):
    c.put("x", "0")
    r = c.txn(success=[c.op_put("a", "1"), c.op_del("x", prev_kv=True)])
    return [r, c.rev()]


@check("txn", "txn.failed_compare_empty_failure_no_revision")
def _(c):
    c.put("a", "1")
    return [c.txn(compare=[c.cmp("a", "VALUE", "EQUAL", "2")],
                  success=[c.op_put("a", "3")]), c.rev(), c.range("a")]


@check("txn", "txn.failure_branch_runs")
def _(c):
    c.put("a", "1")
    return [c.txn(compare=[c.cmp("a", "VALUE", "EQUAL", "2")],
                  success=[c.op_put("a", "3")], failure=[c.op_put("b", "f")]),
            c.rev(), keys(c.range("", end=PREFIX))]


@check("txn", "txn.failure_branch_read_only")
def _(c):
    c.put("a", "1")
    return [c.txn(compare=[c.cmp("a", "VERSION", "EQUAL", 5)],
                  success=[c.op_put("a", "2")], failure=[c.op_range("a")]), c.rev()]


@check("txn", "txn.delete_of_nothing_in_txn")
def _(c):
    return [c.txn(success=[c.op_del("missing", prev_kv=True)]), c.rev()]


@check("txn", "txn.reads_own_earlier_write")
def _(c):
    c.put("a", "old")
    return c.txn(success=[c.op_put("a", "new"), c.op_range("a")])


@check("txn", "txn.read_before_write_sees_old")
def _(c):
    c.put("a", "old")
    return c.txn(success=[c.op_range("a"), c.op_put("a", "new"), c.op_range("a")])


@check("txn", "txn.read_after_delete")
def _(c):
    c.put("a", "1")
    c.put("ab", "2")
    return c.txn(success=[c.op_del("a"), c.op_range("a", end=PREFIX)])


@check("txn", "txn.read_prefix_sees_new_key_and_version")
def _(c):
    c.put("k1", "1")
    return c.txn(success=[c.op_put("k2", "2"), c.op_put("k3", "3"),
                          c.op_range("k", end=PREFIX, count_only=True),
                          c.op_range("k", end=PREFIX)])


@check("txn", "txn.put_prev_kv_in_txn")
def _(c):
    c.put("a", "1")
    return c.txn(success=[c.op_put("a", "2", prev_kv=True)])


@check("txn", "txn.historical_read_in_txn")
def _(c):
    c.put("a", "1")    # r+1
    c.put("a", "2")    # r+2
    return c.txn(success=[c.op_put("b", "x"), c.op_range("a", rev=1)])


@check("txn", "txn.future_read_in_txn")
def _(c):
    c.put("a", "1")
    return [c.txn(success=[c.op_range("a", rev=5)]), c.rev()]


@check("txn", "txn.nested")
def _(c):
    c.put("a", "1")
    r = c.txn(success=[c.op_put("b", "2"),
                       c.op_txn(compare=[c.cmp("a", "VALUE", "EQUAL", "1")],
                                success=[c.op_put("c", "3"), c.op_range("b")])])
    return [r, c.rev(), c.range("c")]


@check("txn", "txn.nested_failure_branch")
def _(c):
    c.put("a", "1")
    r = c.txn(success=[c.op_txn(compare=[c.cmp("a", "VALUE", "EQUAL", "9")],
                                success=[c.op_put("c", "s")],
                                failure=[c.op_put("c", "f"), c.op_range("c")])])
    return [r, c.rev()]


@check("txn", "txn.nested_read_only_takes_no_revision")
def _(c):
    c.put("a", "1")
    return [c.txn(success=[c.op_txn(success=[c.op_range("a")])]), c.rev()]


@check("txn", "txn.nested_twice")
def _(c):
    inner = c.op_txn(success=[c.op_put("c", "3")])
    middle = c.op_txn(success=[c.op_put("b", "2"), inner])
    return [c.txn(success=[c.op_put("a", "1"), middle]), c.rev()]


# ---- write overlap rules

@check("txn", "txn.overlap.put_put_same_key")
def _(c):
    return [c.txn(success=[c.op_put("a", "1"), c.op_put("a", "2")]), c.rev(),
            c.range("a")]


@check("txn", "txn.overlap.range_then_put_is_fine")
def _(c):
    c.put("a", "0")
    return [ok(c.txn(success=[c.op_range("a"), c.op_put("a", "1")])),
            ok(c.txn(success=[c.op_put("a", "2"), c.op_range("a")])), c.rev()]


@check("txn", "txn.overlap.delete_prefix_then_put_inside")
def _(c):
    c.put("p/1", "1")
    return [c.txn(success=[c.op_del("p/", end=PREFIX), c.op_put("p/2", "2")]),
            c.txn(success=[c.op_put("p/2", "2"), c.op_del("p/", end=PREFIX)]),
            c.rev()]


@check("txn", "txn.overlap.delete_key_then_put_same")
def _(c):
    c.put("a", "1")
    return [c.txn(success=[c.op_del("a"), c.op_put("a", "2")]), c.rev()]


@check("txn", "txn.overlap.delete_delete_same")
def _(c):
    c.put("a", "1")
    return [c.txn(success=[c.op_del("a"), c.op_del("a")]), c.rev()]


@check("txn", "txn.overlap.delete_prefix_delete_inside")
def _(c):
    c.put("p/1", "1")
    return [ok(c.txn(success=[c.op_del("p/", end=PREFIX), c.op_del("p/1")])), c.rev()]


@check("txn", "txn.overlap.put_outside_deleted_range")
def _(c):
    c.put("p/1", "1")
    return [ok(c.txn(success=[c.op_del("p/", end=PREFIX), c.op_put("q", "2")])),
            c.rev()]


@check("txn", "txn.overlap.put_at_range_end_is_outside")
def _(c):
    return [ok(c.txn(success=[c.op_del("a", end="b"), c.op_put("b", "2")])),
            ok(c.txn(success=[c.op_del("a", end="b"), c.op_put("a", "2")]))]


@check("txn", "txn.overlap.across_nested_txn")
def _(c):
    return [c.txn(success=[c.op_put("a", "1"),
                           c.op_txn(success=[c.op_put("a", "2")])]),
            c.rev()]


@check("txn", "txn.overlap.put_in_both_branches_is_fine")
def _(c):
    return [ok(c.txn(success=[c.op_put("a", "s")], failure=[c.op_put("a", "f")])),
            c.range("a")]


@check("txn", "txn.overlap.nested_branches_not_taken")
def _(c):
    inner = c.op_txn(compare=[c.cmp("zz", "VERSION", "EQUAL", 0)],
                     success=[c.op_put("b", "1")], failure=[c.op_put("a", "2")])
    return [c.txn(success=[c.op_put("a", "1"), inner]), c.rev()]


@check("txn", "txn.overlap.delete_fromkey_then_put_after")
def _(c):
    return [c.txn(success=[c.op_del("m", end=FROMKEY), c.op_put("z", "1")]),
            ok(c.txn(success=[c.op_del("m", end=FROMKEY), c.op_put("a", "1")])), c.rev()]


@check("txn", "txn.empty_request_op")
def _(c):
    empty = c.M("RequestOp")()
    return [c.txn(success=[empty]), c.txn(success=[c.op_put("a", "1"), empty]),
            c.txn(compare=[c.cmp("a", "VERSION", "EQUAL", 9)], failure=[empty]), c.rev()]


@check("txn", "txn.unknown_compare_enums")
def _(c):
    c.put("a", "1")
    out = []
    for result, target in ((9, 0), (0, 9), (3, 9)):
        cm = c.cmp("a", "VERSION", "EQUAL", 1)
        cm.result = result
        cm.target = target
        out.append(ok(c.txn(compare=[cm], success=[c.op_put("b", "x")])))
    return [out, c.rev()]


# ---- errors part-way: nothing applied

@check("txn", "txn.error_partway.ignore_value_missing")
def _(c):
    r = c.txn(success=[c.op_put("a", "1"), c.op_put("b", ignore_value=True)])
    return {"txn": r, "rev": c.rev(), "first_write_survived": c.range("a").get("count", 0)}


@check("txn", "txn.error_partway.ignore_lease_missing")
def _(c):
    r = c.txn(success=[c.op_put("a", "1"), c.op_put("b", "2", ignore_lease=True)])
    return {"txn": r, "rev": c.rev(), "first_write_survived": c.range("a").get("count", 0)}


@check("txn", "txn.error_partway.unknown_lease")
def _(c):
    r = c.txn(success=[c.op_put("a", "1"), c.op_put("b", "2", lease=0x7e57000000000002)])
    return {"txn": r, "rev": c.rev(), "first_write_survived": c.range("a").get("count", 0)}


@check("txn", "txn.error_partway.ignore_value_of_key_deleted_earlier")
def _(c):
    c.put("b", "0")
    r = c.txn(success=[c.op_put("a", "1"), c.op_del("b"), c.op_put("b", ignore_value=True)])
    return {"txn": r, "rev": c.rev(), "a": c.range("a").get("count", 0),
            "b": c.range("b").get("count", 0)}


@check("txn", "txn.ignore_value_of_key_put_earlier_in_txn")
def _(c):
    r = c.txn(success=[c.op_put("a", "1"), c.op_put("b", "2"),
                       c.op_put("b", ignore_value=True)])
    return [r, c.rev()]


@check("txn", "txn.error_in_nested")
def _(c):
    r = c.txn(success=[c.op_put("a", "1"),
                       c.op_txn(success=[c.op_put("b", ignore_value=True)])])
    return {"txn": r, "rev": c.rev(), "first_write_survived": c.range("a").get("count", 0)}


@check("txn", "txn.empty_key_in_op")
def _(c):
    return [c.txn(success=[c.op_put(b"", "1")]), c.txn(success=[c.op_range(b"")]),
            c.txn(success=[c.op_del(b"")]), c.rev()]


@check("txn", "txn.empty_key_in_compare")
def _(c):
    return [c.txn(compare=[c.cmp(b"", "VERSION", "EQUAL", 0)]), c.rev()]


@check("txn", "txn.empty_key_in_branch_not_taken")
def _(c):
    return [c.txn(compare=[c.cmp("a", "VERSION", "EQUAL", 0)],
                  failure=[c.op_put(b"", "1")]), c.rev()]


# ==========================================================================
# cmp: Txn compares. The key "k" has version 3, create r+1, mod r+4,
# value "m" (and lease L1 for the LEASE checks); each entry is whether the
# compare succeeded.

def _cmpdata(c, with_lease):
    """The lease only for LEASE compares, so that the others do not lean
    on the Lease service."""
    lid = c.grant() if with_lease else None
    c.put("k", "m", lease=lid)     # r+1
    c.put("o", "x")                # r+2
    c.put("k", "m", lease=lid)     # r+3
    c.put("k", "m", lease=lid)     # r+4  version 3, create r+1, mod r+4
    return lid


_CMP_VALUES = {
    "VERSION": lambda lid: [2, 3, 4, 0],
    "CREATE": lambda lid: [0, 1, 2],
    "MOD": lambda lid: [3, 4, 5],
    "VALUE": lambda lid: ["l", "m", "n", "", "mm"],
    "LEASE": lambda lid: [lid - 1, lid, lid + 1, 0],
}

for _t in ("VERSION", "CREATE", "MOD", "VALUE", "LEASE"):
    for _r in ("EQUAL", "GREATER", "LESS", "NOT_EQUAL"):
        def _mkc(target, result):
            def fn(c):
                lid = _cmpdata(c, target == "LEASE")
                out = []
                for v in _CMP_VALUES[target](lid):
                    out.append(ok(c.txn(compare=[c.cmp("k", target, result, v)])))
                return out
            return fn
        check("cmp", "cmp.%s.%s" % (_t.lower(), _r.lower()))(_mkc(_t, _r))


@check("cmp", "cmp.missing_key_each_target")
def _(c):
    out = {}
    for t, vals in (("VERSION", [0, 1]), ("CREATE", [Abs(0), Abs(1)]),
                    ("MOD", [Abs(0), Abs(1)]),
                    ("VALUE", ["", "x"]), ("LEASE", [0, 1])):
        for r in ("EQUAL", "NOT_EQUAL", "GREATER", "LESS"):
            out["%s.%s" % (t, r)] = [ok(c.txn(compare=[c.cmp("nope", t, r, v)]))
                                     for v in vals]
    return out


def _cmprange(c):
    c.put("r/a", "1")     # r+1
    c.put("r/b", "1")     # r+2
    c.put("r/b", "2")     # r+3   versions: a=1, b=2
    c.put("s", "1")       # r+4


@check("cmp", "cmp.range_version")
def _(c):
    _cmprange(c)
    out = []
    for r, v in (("EQUAL", 1), ("GREATER", 0), ("GREATER", 1), ("LESS", 3),
                 ("LESS", 2), ("NOT_EQUAL", 3), ("NOT_EQUAL", 1)):
        out.append([r, v, ok(c.txn(compare=[c.cmp("r/", "VERSION", r, v, end=PREFIX)]))])
    return out


@check("cmp", "cmp.range_value")
def _(c):
    _cmprange(c)
    return [ok(c.txn(compare=[c.cmp("r/", "VALUE", "EQUAL", "1", end=PREFIX)])),
            ok(c.txn(compare=[c.cmp("r/", "VALUE", "LESS", "3", end=PREFIX)])),
            ok(c.txn(compare=[c.cmp("r/", "VALUE", "NOT_EQUAL", "2", end=PREFIX)]))]


@check("cmp", "cmp.range_mod_and_create")
def _(c):
    _cmprange(c)
    return [ok(c.txn(compare=[c.cmp("r/", "MOD", "LESS", 4, end=PREFIX)])),
            ok(c.txn(compare=[c.cmp("r/", "MOD", "GREATER", 1, end=PREFIX)])),
            ok(c.txn(compare=[c.cmp("r/", "CREATE", "LESS", 3, end=PREFIX)])),
            ok(c.txn(compare=[c.cmp("r/", "CREATE", "EQUAL", 1, end=PREFIX)]))]


@check("cmp", "cmp.range_lease")
def _(c):
    lid = c.grant()
    c.put("l/a", "1", lease=lid)
    c.put("l/b", "1", lease=lid)
    c.put("l/c", "1")
    return [ok(c.txn(compare=[c.cmp("l/", "LEASE", "EQUAL", lid, end="l/c")])),
            ok(c.txn(compare=[c.cmp("l/", "LEASE", "EQUAL", lid, end=PREFIX)])),
            ok(c.txn(compare=[c.cmp("l/", "LEASE", "LESS", lid + 1, end=PREFIX)])),
            ok(c.txn(compare=[c.cmp("l/", "LEASE", "NOT_EQUAL", 0, end=PREFIX)]))]


@check("cmp", "cmp.range_with_no_keys")
def _(c):
    _cmprange(c)
    return [ok(c.txn(compare=[c.cmp("none/", t, r, v, end=PREFIX)]))
            for t, r, v in (("VERSION", "EQUAL", 0), ("VERSION", "GREATER", 0),
                            ("VALUE", "EQUAL", ""), ("MOD", "LESS", 100),
                            ("CREATE", "EQUAL", Abs(0)), ("MOD", "EQUAL", Abs(0)),
                            ("LEASE", "EQUAL", 0))]


@check("cmp", "cmp.range_fromkey")
def _(c):
    _cmprange(c)
    return [ok(c.txn(compare=[c.cmp("r/", "VERSION", "GREATER", 0, end=FROMKEY)])),
            ok(c.txn(compare=[c.cmp("s", "VERSION", "EQUAL", 1, end=FROMKEY)]))]


@check("cmp", "cmp.absolute_zero_revisions")
def _(c):
    _cmprange(c)
    return [ok(c.txn(compare=[c.cmp("r/a", t, r, Abs(0))]))
            for t, r in (("CREATE", "GREATER"), ("MOD", "GREATER"), ("CREATE", "EQUAL"),
                         ("MOD", "NOT_EQUAL"), ("LEASE", "EQUAL"))]


@check("cmp", "cmp.several_compares_all_must_hold")
def _(c):
    _cmprange(c)
    t1 = c.cmp("r/a", "VERSION", "EQUAL", 1)
    t2 = c.cmp("r/b", "VALUE", "EQUAL", "2")
    f1 = c.cmp("s", "VALUE", "EQUAL", "nope")
    return [ok(c.txn(compare=[t1, t2])), ok(c.txn(compare=[t1, f1, t2]))]


@check("cmp", "cmp.compare_then_write_response")
def _(c):
    _cmprange(c)
    return c.txn(compare=[c.cmp("s", "MOD", "EQUAL", 4)],
                 success=[c.op_put("s", "2", prev_kv=True), c.op_range("s")],
                 failure=[c.op_range("s")])


# ==========================================================================
# compact: on its own server, in order

def _compactdata(c):
    c.put("a", "1")    # r+1
    c.put("a", "2")    # r+2
    c.put("b", "1")    # r+3
    c.delete("b")      # r+4
    c.put("a", "3")    # r+5


@check("compact", "compact.revision_zero_on_fresh_store")
def _(c):
    return [c.compact(absrev=0), c.rev()]


@check("compact", "compact.revision_one_on_fresh_store")
def _(c):
    return [c.compact(absrev=1), c.rev()]


@check("compact", "compact.zero_after_compaction")
def _(c):
    return [c.compact(absrev=0), c.compact(absrev=1), c.rev()]


@check("compact", "compact.future_revision")
def _(c):
    _compactdata(c)
    return [c.compact(6), c.compact(100), c.rev()]


@check("compact", "compact.at_middle_takes_no_revision")
def _(c):
    _compactdata(c)
    return [c.compact(3), c.rev()]


@check("compact", "compact.reads_below_compacted")
def _(c):
    _compactdata(c)
    c.compact(3)
    return [c.range("a", rev=r) for r in (1, 2, 3, 4, 5)]


@check("compact", "compact.deleted_key_history")
def _(c):
    _compactdata(c)
    c.compact(4)
    return [keys(c.range("", end=PREFIX, rev=4)), keys(c.range("", end=PREFIX, rev=5)),
            c.range("b", rev=4)]


@check("compact", "compact.same_revision_again")
def _(c):
    _compactdata(c)
    c.compact(3)
    return [c.compact(3), c.compact(2), c.rev()]


@check("compact", "compact.current_revision")
def _(c):
    _compactdata(c)
    return [c.compact(5), c.range("a", rev=5), c.range("a"), c.rev()]


@check("compact", "compact.physical")
def _(c):
    _compactdata(c)
    return [c.compact(4, physical=True), c.range("a", rev=3), c.range("a", rev=4)]


@check("compact", "compact.txn_read_below_compacted")
def _(c):
    _compactdata(c)
    c.compact(3)
    return [c.txn(success=[c.op_put("z", "1"), c.op_range("a", rev=2)]), c.rev(),
            c.range("z")]


@check("compact", "compact.versions_survive")
def _(c):
    _compactdata(c)
    c.compact(5)
    return [c.put("a", "4", prev_kv=True), c.range("a")]


@check("compact", "compact.filters_after_compaction")
def _(c):
    _compactdata(c)
    c.compact(5)
    return c.range("", end=PREFIX, min_mod=1, max_create=3)


# ==========================================================================
# limits: --max-txn-ops (128) and --max-request-bytes (1.5 MiB), defaults

@check("limits", "limits.txn_128_ops")
def _(c):
    return [ok(c.txn(success=[c.op_put("k%03d" % i, "v") for i in range(128)])), c.rev()]


@check("limits", "limits.txn_129_ops")
def _(c):
    return [c.txn(success=[c.op_put("k%03d" % i, "v") for i in range(129)]), c.rev()]


@check("limits", "limits.txn_129_failure_ops")
def _(c):
    return [c.txn(failure=[c.op_range("k%03d" % i) for i in range(129)]), c.rev()]


@check("limits", "limits.txn_129_compares")
def _(c):
    return [c.txn(compare=[c.cmp("k%03d" % i, "VERSION", "EQUAL", 0) for i in range(129)]),
            c.rev()]


@check("limits", "limits.txn_128_reads")
def _(c):
    return ok(c.txn(success=[c.op_range("k%03d" % i) for i in range(128)]))


@check("limits", "limits.request_too_large")
def _(c):
    return [c.put("big", b"x" * (1536 * 1024 + 1)), c.rev()]


@check("limits", "limits.request_just_under")
def _(c):
    return [c.put("big", b"x" * (1536 * 1024 - 256))["header"], c.rev()]


@check("limits", "limits.grpc_message_too_large")
def _(c):
    return [c.put("big", b"x" * (3 * 1024 * 1024)), c.rev()]


@check("limits", "limits.txn_too_large")
def _(c):
    v = b"y" * (800 * 1024)
    return [c.txn(success=[c.op_put("a", v), c.op_put("b", v)]), c.rev()]


@check("limits", "limits.range_result_not_limited")
def _(c):
    v = b"z" * (1024 * 1024)
    c.put("a", v)
    c.put("b", v)
    r = c.range("", end=PREFIX)
    return keys(r) if "error" not in r else r


# ==========================================================================
# restart: the same data dir after a clean stop (SIGTERM) or a crash
# (SIGKILL); every acknowledged write, the revision counter and the
# compaction survive.

def _restartdata(c):
    c.put("a", "1")                                        # r+1
    c.put("b", "1")                                        # r+2
    c.txn(success=[c.op_put("a", "2"), c.op_put("c", "1")])  # r+3
    c.delete("b")                                          # r+4
    c.put("a", "3")                                        # r+5


@check("restart", "restart.clean_stop_keeps_everything")
def _(c):
    _restartdata(c)
    c.restart()
    return [c.rev(), c.range("", end=PREFIX), keys(c.range("", end=PREFIX, rev=3)),
            c.range("b", rev=2), c.put("d", "1")]


@check("restart", "restart.kill_keeps_acknowledged_writes")
def _(c):
    _restartdata(c)
    c.restart(kill=True)
    return [c.rev(), c.range("", end=PREFIX), keys(c.range("", end=PREFIX, rev=3)),
            c.put("a", "4", prev_kv=True)]


@check("restart", "restart.compaction_survives")
def _(c):
    _restartdata(c)
    c.compact(3)
    c.restart()
    return [c.range("a", rev=2), c.range("a", rev=3), c.compact(3), c.rev()]


@check("restart", "restart.no_revision_taken_by_restart")
def _(c):
    _restartdata(c)
    c.restart()
    c.restart(kill=True)
    return [c.rev(), c.put("z", "1")["header"]]


# ==========================================================================
# concurrency: results that must not depend on scheduling

@check("concurrency", "concurrency.cas_increments_are_serialised")
def _(c):
    """4 clients x 25 compare-and-swap increments of one counter, each
    retried until its compare holds: every success takes its own revision,
    no increment is lost, and the compare is evaluated under the write."""
    import threading
    c.put("n", "0")
    won, errors = [], []

    def client():
        done = 0
        for _ in range(2000):
            if done == 25:
                return
            r = c.range("n")
            if "error" in r:
                errors.append(r["error"])
                return
            kv = r["kvs"][0]
            mod = int(kv["mod_revision"][1:])
            t = c.txn(compare=[c.cmp("n", "MOD", "EQUAL", mod)],
                      success=[c.op_put("n", str(int(kv["value"]) + 1))])
            if "error" in t:
                errors.append(t["error"])
                return
            if t["succeeded"]:
                won.append(t["header"]["revision"])
                done += 1
    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    revs = sorted(int(r[1:]) for r in won)
    return {"errors": errors, "successes": len(won),
            "distinct_consecutive_revisions": revs == list(range(2, 2 + len(revs))),
            "final": c.range("n"), "rev": c.rev()}


@check("concurrency", "concurrency.readers_never_see_half_a_txn")
def _(c):
    """A writer puts the same value into p/a and p/b in one txn, 60 times;
    two readers read the prefix meanwhile and count reads where they differ."""
    import threading
    c.txn(success=[c.op_put("p/a", "0"), c.op_put("p/b", "0")])
    stop = threading.Event()
    torn, reads, errors = [], [0], []

    def reader():
        while not stop.is_set():
            r = c.range("p/", end=PREFIX)
            if "error" in r:
                errors.append(r["error"])
                return
            vals = [kv.get("value") for kv in r.get("kvs", [])]
            reads[0] += 1
            if len(vals) != 2 or vals[0] != vals[1]:
                torn.append(vals)

    rs = [threading.Thread(target=reader) for _ in range(2)]
    for t in rs:
        t.start()
    try:
        for i in range(1, 61):
            w = c.txn(success=[c.op_put("p/a", str(i)), c.op_put("p/b", str(i))])
            if "error" in w:
                errors.append(w["error"])
                break
    finally:
        stop.set()
        for t in rs:
            t.join()
    return {"errors": errors, "torn_reads": torn[:5], "some_reads": reads[0] > 0,
            "rev": c.rev(), "final": keys(c.range("p/", end=PREFIX))}


# ==========================================================================
# status: Maintenance.Status of a single member

@check("status", "status.identity")
def _(c):
    s = c.status()
    return {"version": s.version, "leader_is_self": s.leader == s.header.member_id,
            "is_learner": s.isLearner, "errors": list(s.errors),
            "db_size_positive": s.dbSize > 0,
            "db_size_in_use_le_db_size": 0 < s.dbSizeInUse <= s.dbSize}


@check("status", "status.raft_term")
def _(c):
    s = c.status()
    return {"raft_term": s.raftTerm, "header_raft_term": s.header.raft_term}


@check("status", "status.raft_index_counts_proposals")
def _(c):
    """How far raftIndex / raftAppliedIndex move for each kind of request."""
    out = {}
    steps = (("3 puts", lambda: [c.put("k%d" % i, "v") for i in range(3)]),
             ("2 ranges", lambda: [c.range("k0"), c.range("k1")]),
             ("failed put", lambda: c.put("missing", ignore_value=True)),
             ("delete of nothing", lambda: c.delete("missing")),
             ("read-only txn", lambda: c.txn(success=[c.op_range("k0")])),
             ("compact", lambda: c.compact(1)))
    for name, step in steps:
        before = c.status()
        step()
        after = c.status()
        out[name] = [after.raftIndex - before.raftIndex,
                     after.raftAppliedIndex - before.raftAppliedIndex]
    return out


# ==========================================================================
# random: seeded sequences of mixed operations over a small key space; every
# answer is compared. The sequence depends only on the seed (and on the
# revision the server reports, which must agree anyway).

_RKEYS = ["a", "a/1", "a/2", "a/2/x", "b", "b/1", "c", "d\xff"]


def _rkey(rnd):
    return rnd.choice(_RKEYS)


def _rrange_kw(rnd, cur, low):
    kw = {}
    x = rnd.random()
    if x < 0.3:
        kw["end"] = PREFIX
    elif x < 0.45:
        kw["end"] = rnd.choice(_RKEYS)
    y = rnd.random()
    if y < 0.3 and cur > low:
        kw["rev"] = rnd.randint(low, cur)
    elif y < 0.33 and low > 1:
        kw["rev"] = rnd.randint(1, low - 1)      # below the compaction
    elif y < 0.35:
        kw["rev"] = cur + rnd.randint(1, 3)      # future
    if rnd.random() < 0.3:
        kw["limit"] = rnd.randint(1, 3)
    if rnd.random() < 0.25:
        kw["sort_order"] = rnd.choice(["ASCEND", "DESCEND"])
        kw["sort_target"] = rnd.choice(["KEY", "CREATE", "MOD", "VALUE"])
    if rnd.random() < 0.1:
        kw["count_only"] = True
    if rnd.random() < 0.1:
        kw["keys_only"] = True
    if rnd.random() < 0.1:
        kw["min_mod"] = rnd.randint(low, cur) if cur > low else None
    return kw


def _rop(c, rnd, cur, low, used):
    """One random request op for a txn. Writes mostly go to keys the txn
    has not written yet (used), so that most txns are valid; now and then
    one overlaps on purpose."""
    x = rnd.random()
    k = _rkey(rnd)
    if x < 0.65 and k in used and rnd.random() < 0.9:
        free = [f for f in _RKEYS if f not in used]
        if not free:
            return c.op_range(k, **_rrange_kw(rnd, cur, low))
        k = rnd.choice(free)
    if x < 0.45:
        used.add(k)
        return c.op_put(k, "v%d" % rnd.randint(0, 99), prev_kv=rnd.random() < 0.3)
    if x < 0.65:
        kw = {"prev_kv": rnd.random() < 0.5}
        used.add(k)
        if rnd.random() < 0.15:
            kw["end"] = PREFIX
            used.update(f for f in _RKEYS if f.startswith(k))
        return c.op_del(k, **kw)
    return c.op_range(k, **_rrange_kw(rnd, cur, low))


def _rcmp(c, rnd, cur):
    t = rnd.choice(["VERSION", "CREATE", "MOD", "VALUE"])
    r = rnd.choice(["EQUAL", "GREATER", "LESS", "NOT_EQUAL"])
    v = {"VERSION": rnd.randint(0, 3), "CREATE": rnd.randint(0, cur + 1),
         "MOD": rnd.randint(0, cur + 1), "VALUE": "v%d" % rnd.randint(0, 99)}[t]
    return c.cmp(_rkey(rnd), t, r, v, end=PREFIX if rnd.random() < 0.2 else None)


def _random_run(c, seed, steps):
    import random as _random
    rnd = _random.Random(seed)
    out = []
    low = 0          # lowest readable relative revision (compaction)
    for _ in range(steps):
        cur = int(c.rev()[1:])
        x = rnd.random()
        k = _rkey(rnd)
        if x < 0.3:
            out.append(c.put(k, "v%d" % rnd.randint(0, 99), prev_kv=rnd.random() < 0.3))
        elif x < 0.4:
            out.append(c.delete(k, end=PREFIX if rnd.random() < 0.4 else None,
                                prev_kv=rnd.random() < 0.5))
        elif x < 0.65:
            out.append(c.range(k, **_rrange_kw(rnd, cur, low)))
        elif x < 0.97:
            used = set()
            ops = [_rop(c, rnd, cur, low, used) for _ in range(rnd.randint(1, 4))]
            used = set()
            fail = [_rop(c, rnd, cur, low, used) for _ in range(rnd.randint(0, 2))]
            cmps = [_rcmp(c, rnd, cur) for _ in range(rnd.randint(0, 2))]
            out.append(c.txn(compare=cmps, success=ops, failure=fail))
        elif cur > low + 2:
            target = rnd.randint(low + 1, cur)
            out.append(c.compact(target))
            low = target
        else:
            out.append(c.rev())
    out.append(c.range("", end=PREFIX))
    return out


for _seed in range(1, 9):
    def _mkr(seed):
        def fn(c):
            return _random_run(c, seed, 200)
        return fn
    check("random", "random.mixed_ops_seed_%d" % _seed)(_mkr(_seed))
