"""``python -I -m mcpd.walker --fd N``: see :mod:`mcpd.walker.main`."""

import sys

from mcpd.walker.main import main

sys.exit(main())
