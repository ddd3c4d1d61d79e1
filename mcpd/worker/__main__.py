"""``python -I -m mcpd.worker``: see :mod:`mcpd.worker.main`."""

import sys

from mcpd.worker.main import main

sys.exit(main())
