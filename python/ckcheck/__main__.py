"""`python -m ckcheck ARGS...`: the ckcheck command line, in this Python (Python models allowed)."""

import sys

from ckcheck import main

sys.exit(main(sys.argv[1:]))
