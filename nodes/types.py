"""Types the layers share."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

#: Who acts: a user, or nobody logged in (a worker acting for the panel, the CLI's own account).
Actor = AbstractBaseUser | AnonymousUser
