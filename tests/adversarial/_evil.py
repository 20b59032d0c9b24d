"""A module nothing imports: importing it creates the file named by FOUNDRY_TEST_MARKER.

An error record that names ``tests.adversarial._evil.Evil`` must not make the reader
import this module (before the fix, ``decode_error`` imported whatever a record named).
"""

from __future__ import annotations

import os

_marker = os.environ.get("FOUNDRY_TEST_MARKER")
if _marker:
    with open(_marker, "w") as _fh:
        _fh.write("tests.adversarial._evil was imported because a record named it")


class Evil(Exception):
    pass
