"""``python -m foundry``: the ``foundry`` command, where its script is not on ``PATH``
(a virtualenv not activated, ``pipx run``, a container's ``python -m``)."""

import sys

from foundry.cli import main

if __name__ == "__main__":
    sys.exit(main())
