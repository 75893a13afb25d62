"""``python -m leaseguard`` is the ``leaseguard`` command."""

import sys

from leaseguard.cli import main

sys.exit(main())
