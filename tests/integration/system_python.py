"""Gives the integration tests grpc: when the python running a test has no
grpc module (a pyenv python without Debian's python3-grpcio), the test is
run again, once, under /usr/bin/python3.

Usage (after putting this directory on sys.path): from system_python import grpc
"""

import os
import sys

try:
    import grpc  # noqa: F401  re-exported
except ImportError:
    if not os.environ.get("CAIRN_IT_REEXEC") and os.path.exists("/usr/bin/python3"):
        os.environ["CAIRN_IT_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise
