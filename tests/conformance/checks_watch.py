"""The Watch conformance checks (suite "watch"): etcd's bidirectional
/etcdserverpb.Watch/Watch stream, measured against etcd 3.4.

Opt-in: the harness runs this suite only when asked (--suite watch), until
cairn serves Watch. See WATCH-LEASE-MEASURED.md.
"""

from checks_kv import check  # noqa: F401
