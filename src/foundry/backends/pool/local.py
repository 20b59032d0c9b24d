"""The embedded work pool, ``local://`` (the default): worker processes on this machine,
started by the app, the dispatcher in the submitting process. The dispatcher is the
family's ``_dispatch`` (the served and NATS worker hosts run the same one behind their
fronts); this engine is that dispatcher, called in-process.
"""

from __future__ import annotations

from foundry.backends.pool._dispatch import LocalPool

__all__ = ["LocalPool"]
