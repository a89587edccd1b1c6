"""The Lease conformance checks (suite "lease"): LeaseGrant, LeaseRevoke,
LeaseKeepAlive, LeaseTimeToLive, LeaseLeases, keys under leases, expiry and
restart, measured against etcd 3.4.

Opt-in: the harness runs this suite only when asked (--suite lease), until
cairn serves Lease. See WATCH-LEASE-MEASURED.md.
"""

from checks_kv import check  # noqa: F401
