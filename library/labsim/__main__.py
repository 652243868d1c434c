"""``python -m labsim up|down|status [...]``: the simulated lab's command line (``gpulab lab`` runs it)."""

import sys

from labsim.cli import main

sys.exit(main(sys.argv[1:]))
