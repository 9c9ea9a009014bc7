"""``python -m ascend_ops.node_day``: see :mod:`ascend_ops.node_day.cli`."""

import sys

from .cli import main

sys.exit(main())
