"""``python -m agentkernel`` runs the command line."""

import sys

from agentkernel.cli import main

sys.exit(main())
