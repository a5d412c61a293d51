"""``python -m rivven_connect``: the same as the ``rivven-connect`` command."""

import sys

from rivven_connect.cli import main

sys.exit(main())
