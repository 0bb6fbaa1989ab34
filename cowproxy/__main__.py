"""``python -m cowproxy``: the ``cowproxy`` command."""

from __future__ import annotations

import sys

from cowproxy.main import main

sys.exit(main())
