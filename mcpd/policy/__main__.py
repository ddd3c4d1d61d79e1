"""``python -I -m mcpd.policy``, started by the root helper only: see :mod:`mcpd.policy.main`."""

import sys

from mcpd.policy.main import main

sys.exit(main())
