#!/usr/bin/python3
"""The harness's verdict logic, without servers: a deviation fails unless
ledgered, a ledgered check that matches fails (two-sided), a ledger entry
for an unknown check fails, and a ledger entry without a reason is refused."""

import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (re-executes under /usr/bin/python3 if needed)

NAMES = ["a.one", "a.two", "a.three"]
ETCD = {"a.one": {"header": {"revision": "r+1"}}, "a.two": [True, "r+0"],
        "a.three": {"error": ["INVALID_ARGUMENT", "etcdserver: key not found"]}}


def verdict(cairn, ledger, names=NAMES, pins=None):
    out = io.StringIO()
    with redirect_stdout(out):
        ok = harness.compare("etcd", ETCD, "cairn", cairn, ledger, names, NAMES, pins)
    return ok, out.getvalue()


class Verdict(unittest.TestCase):
    def test_all_match(self):
        ok, out = verdict(dict(ETCD), {})
        self.assertTrue(ok)
        self.assertIn("3 checks, 3 matched, 0 ledgered deviations, 0 failures", out)

    def test_deviation_fails_and_shows_both(self):
        cairn = dict(ETCD, **{"a.two": [True, "r+1"]})
        ok, out = verdict(cairn, {})
        self.assertFalse(ok)
        self.assertIn("FAIL a.two: deviation", out)
        self.assertIn('[true, "r+0"]', out)
        self.assertIn('[true, "r+1"]', out)

    def test_missing_result_is_a_deviation(self):
        cairn = dict(ETCD)
        del cairn["a.one"]
        ok, _ = verdict(cairn, {})
        self.assertFalse(ok)

    def test_ledgered_deviation_passes(self):
        cairn = dict(ETCD, **{"a.two": [True, "r+1"]})
        ok, out = verdict(cairn, {"a.two": "because"})
        self.assertTrue(ok)
        self.assertIn("1 ledgered deviations", out)

    def test_ledger_does_not_excuse_a_harness_failure(self):
        cairn = dict(ETCD, **{"a.two": {"harness": "server did not start"}})
        ok, out = verdict(cairn, {"a.two": "because"})
        self.assertFalse(ok)
        self.assertIn("harness failure", out)

    def test_pinned_ledger_entry(self):
        cairn = dict(ETCD, **{"a.two": [True, "r+1"]})
        ok, _ = verdict(cairn, {"a.two": "because"}, pins={"a.two": [True, "r+1"]})
        self.assertTrue(ok)
        cairn = dict(ETCD, **{"a.two": [True, "r+2"]})
        ok, out = verdict(cairn, {"a.two": "because"}, pins={"a.two": [True, "r+1"]})
        self.assertFalse(ok)
        self.assertIn("not the pinned one", out)

    def test_ledger_entry_that_matches_fails(self):
        ok, out = verdict(dict(ETCD), {"a.two": "because"})
        self.assertFalse(ok)
        self.assertIn("no longer deviates", out)

    def test_ledger_entry_for_unknown_check_fails(self):
        ok, out = verdict(dict(ETCD), {"a.gone": "because"})
        self.assertFalse(ok)
        self.assertIn("does not exist", out)

    def test_only_subset_ignores_ledger_of_unselected(self):
        cairn = dict(ETCD, **{"a.two": [True, "r+1"]})
        ok, _ = verdict(cairn, {"a.two": "because"}, names=["a.one"])
        self.assertTrue(ok)

    def test_ledger_needs_reason(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([{"check": "a.one"}], f)
        try:
            with self.assertRaises(harness.HarnessError):
                harness.load_ledger(f.name)
        finally:
            os.unlink(f.name)

    def test_committed_ledger_is_valid(self):
        ledger = harness.load_ledger(os.path.join(harness.HERE, "ledger.json"))
        names = {n for _s, n, _f in harness.CHECKS}
        for check in ledger:
            self.assertIn(check, names)


class Sanitizer(unittest.TestCase):
    def test_report_found_in_log(self):
        d = tempfile.mkdtemp()
        srv = harness.Server("cairn", "/bin/true", d)
        with open(srv.log_path, "w") as f:
            f.write("starting\n==1==ERROR: LeakSanitizer: detected memory leaks\n"
                    "Direct leak of 8 byte(s)\n")
        self.assertIn("Direct leak", srv.sanitizer_report())
        with open(srv.log_path, "w") as f:
            f.write("starting\nstopped\n")
        self.assertIsNone(srv.sanitizer_report())


class Normalise(unittest.TestCase):
    def test_prefix_end(self):
        self.assertEqual(harness.prefix_end(b"a"), b"b")
        self.assertEqual(harness.prefix_end(b"a\xff"), b"b")
        self.assertEqual(harness.prefix_end(b"\xff\xff"), b"\x00")

    def test_check_names_unique_and_enough(self):
        names = [n for _s, n, _f in harness.CHECKS]
        self.assertEqual(len(names), len(set(names)))
        self.assertGreaterEqual(len(names), 80)


if __name__ == "__main__":
    unittest.main()
