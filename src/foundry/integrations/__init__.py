"""Framework hooks: where an ASGI service or a Django project meets a Foundry app.

* :mod:`foundry.integrations.starlette` — a lifespan for Starlette and FastAPI that
  closes the app with the service and, for development, runs its workers in-process.
* :mod:`foundry.integrations.django` — ``settings.FOUNDRY`` → ``Foundry(...)``, an
  ``AppConfig`` that finds the project's ``tasks`` modules, and
  :func:`~foundry.integrations.django.submit_on_commit`.

Above ``foundry.app`` in the layers: nothing in Foundry imports these, and each imports
its framework only when used. See ``docs/integrations.md``.
"""
