"""`python -m runner`: the entry point a sandbox host starts (see runner.main)."""

import sys

from runner.main import main

sys.exit(main())
