"""``python -m pymq.admin``: see :mod:`pymq.admin.cli`."""

from __future__ import annotations

import sys

from pymq.admin.cli import main

if __name__ == "__main__":
    sys.exit(main())
