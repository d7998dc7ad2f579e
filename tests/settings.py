"""The panel's settings for the test suite: the production module, with a fast password hasher.

The production hasher (PBKDF2, hundreds of thousands of rounds) costs about 0.3 s for every user
a test makes or logs in; nothing a test checks depends on its cost. Every process the suite
starts (the CLI, Celery workers, the ASGI panel) inherits ``DJANGO_SETTINGS_MODULE`` and so
reads these settings too, and a password set in the test process is checked the same way there.
"""

from __future__ import annotations

from controlpanel.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
