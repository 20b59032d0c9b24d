"""Exception types of a module that is *not* any unit's own: rebuilt only when registered.

``SideEffectError``'s constructor creates the file named by ``FOUNDRY_TEST_MARKER``: if
the file appears, something constructed a type the allow-list does not admit.
"""

from __future__ import annotations

import os


class OtherError(Exception):
    """A third-party library's error, as far as the units are concerned."""


class SideEffectError(Exception):
    def __init__(self, *args: object) -> None:
        marker = os.environ.get("FOUNDRY_TEST_MARKER")
        if marker:
            with open(marker, "w") as fh:
                fh.write("SideEffectError was constructed from a record")
        super().__init__(*args)
