"""`python -m ckcheck ARGS...`: the ckcheck command line, in this Python (Python models allowed)."""

import os
import sys

from ckcheck import main

status = main(sys.argv[1:])
if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
    # A rank of a data-parallel run: its report is written and its process group closed. The
    # interpreter's own teardown can abort in the distributed backend's threads ("terminate called
    # without an active exception"), which would turn a finished rank into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
sys.exit(status)
