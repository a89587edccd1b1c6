"""What the integration tests share for their verdict: one list of failed
checks per test process, the check that records a failure and prints it,
and the removal of the header fields that legitimately differ between etcd
and cairn (ids depend on the ports; raft_term is a documented constant on
cairn) before two JSON answers are compared, and the test's last line and
exit status."""

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def finish(passed="ok"):
    """The test's verdict: prints how many checks failed, or |passed| when
    none did, and returns the exit status (1 on any failure)."""
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print(passed)
    return 0


def strip_ids(x):
    if isinstance(x, dict):
        return {k: strip_ids(v) for k, v in x.items()
                if k not in ("cluster_id", "member_id", "raft_term")}
    if isinstance(x, list):
        return [strip_ids(v) for v in x]
    return x
