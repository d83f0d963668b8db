"""``python -m agentkernel`` runs the command line."""

import sys

from agentkernel.cli.commands import main

sys.exit(main())
