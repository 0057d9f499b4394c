"""``python -m jaxdistill`` runs the CLI."""

import sys

from jaxdistill.cli.main import main

sys.exit(main())
