"""``python -I -m mcpd.helper``: see :mod:`mcpd.helper.main`."""

import sys

from mcpd.helper.main import main

sys.exit(main())
