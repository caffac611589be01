"""``python -m raydelay.cli``: the ``raydelay`` command."""

import sys

from raydelay.cli import main

sys.exit(main())
