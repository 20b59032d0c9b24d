"""Settings of the Django example: one SQLite database, Foundry's state beside it.

``FOUNDRY`` is what ``Foundry(...)`` takes (docs/integrations.md); here the embedded
default under ``SHOP_DATA`` (the project directory unless set), so the web process and
``foundry run foundry.integrations.django:app`` share one queue.
"""

import os
from pathlib import Path

DATA = Path(os.environ.get("SHOP_DATA", Path(__file__).resolve().parent.parent))

SECRET_KEY = "example-only-not-a-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
INSTALLED_APPS = ["foundry.integrations.django", "orders"]
ROOT_URLCONF = "shop.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DATA / "shop.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True

FOUNDRY = {"name": "shop", "home": DATA / ".foundry"}
