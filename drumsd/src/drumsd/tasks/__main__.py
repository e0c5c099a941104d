"""`python -m drumsd.tasks [ROOT]`: build the checker venv ahead of the daemon's first start."""

import sys

from .checker_venv import main

sys.exit(main())
