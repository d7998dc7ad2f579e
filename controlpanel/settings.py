"""Rankwise settings: the only settings module, read from top to bottom.

Every value comes from the environment (see ``.env.example``); a ``.env`` file in the project folder
fills in what the environment leaves unset. With no environment at all the panel runs on a fresh
clone: SQLite in ``var/``, Redis on 127.0.0.1:6379, secrets generated into ``var/`` on first use.
"""

from __future__ import annotations

import zoneinfo
from datetime import timedelta
from pathlib import Path

import dj_database_url
import django_stubs_ext
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from dotenv import load_dotenv

from controlpanel.env import (
    env_bool,
    env_file,
    env_int,
    env_list,
    env_secret,
    env_str,
    private_file,
    private_folder,
    random_token,
)

# Lets generic Django classes (ModelAdmin[Node], ModelForm[Node]) be subscripted at run time.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
# Variables already in the environment win over the .env file.
load_dotenv(BASE_DIR / ".env", override=False)

STATE_DIR = Path(env_str("RANKWISE_STATE_DIR", str(BASE_DIR / "var")))
if not str(STATE_DIR).strip() or (STATE_DIR.exists() and not STATE_DIR.is_dir()):
    raise ImproperlyConfigured(f"RANKWISE_STATE_DIR={str(STATE_DIR)!r} is not a usable folder.")
private_folder(STATE_DIR)

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_secret("SECRET_KEY", STATE_DIR, random_token)
# Fernet key for secrets stored in the database (SSH private keys).
RANKWISE_ENCRYPTION_KEY = env_secret(
    "RANKWISE_ENCRYPTION_KEY", STATE_DIR, lambda: Fernet.generate_key().decode()
)
try:
    Fernet(RANKWISE_ENCRYPTION_KEY)
except ValueError:
    raise ImproperlyConfigured(
        "RANKWISE_ENCRYPTION_KEY is not a Fernet key (32 url-safe base64-encoded bytes)."
    ) from None
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1")
if not ALLOWED_HOSTS and not DEBUG:
    raise ImproperlyConfigured("ALLOWED_HOSTS is empty: name the host names the panel answers to.")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.forms",
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "ninja",  # the API's docs page uses its Swagger UI static files, not a CDN
    "axes",
    "nodes",
]

MIDDLEWARE = [
    "nodes.middleware.RequestIdMiddleware",
    "nodes.middleware.ApiNulMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "nodes.middleware.QueueUnavailableMiddleware",
    # Last, as django-axes asks: it turns a refused login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "controlpanel.urls"
ASGI_APPLICATION = "controlpanel.asgi.application"
WSGI_APPLICATION = "controlpanel.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "nodes.context_processors.roles",
            ],
            "builtins": ["template_partials.templatetags.partials"],
        },
    },
]
FORM_RENDERER = "controlpanel.renderers.FormRenderer"

try:
    DATABASES = {
        "default": dj_database_url.parse(
            env_str("DATABASE_URL", f"sqlite:///{STATE_DIR / 'rankwise.sqlite3'}"),
            conn_max_age=max(0, env_int("DATABASE_CONN_MAX_AGE", 0)),
        )
    }
except ValueError as exc:  # dj-database-url's UnknownSchemeError is a ValueError
    raise ImproperlyConfigured(f"DATABASE_URL is not a database URL: {exc}") from None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    if Path(DATABASES["default"]["NAME"]).parent == STATE_DIR:
        # The panel's own database: owner-only like its folder (SQLite gives its WAL the same).
        private_file(Path(DATABASES["default"]["NAME"]))
    # WAL lets the web server read while a worker writes; the busy timeout (seconds) and
    # IMMEDIATE transactions make concurrent writers wait instead of failing with "locked".
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Request bodies past these are refused before Django reads them (controlpanel.body_limit):
# bytes by path prefix (a file upload's own limit), and for every other path.
REQUEST_BODY_LIMITS = {"/diagnose/": 64 * 2**20, "/launch-profiles/import/": 8 * 2**20}
REQUEST_BODY_MAX_BYTES = 16 * 2**20
# Django reads a form body into memory up to this (its default, 2.5 MB, answered a pasted 4 MB
# log with a bare 400); the limits above refuse what is larger, with a message.
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_BODY_MAX_BYTES
# Login brute-force protection (django-axes): after RANKWISE_LOGIN_FAILURE_LIMIT failures for one
# account from one address, that account's logins from there are refused for
# RANKWISE_LOGIN_COOLOFF_MINUTES, the right password included; audited as ``auth.locked_out``.
# Per account and address, so a colleague's typos behind the same NAT lock nobody else out.
# ``manage.py axes_reset_username NAME`` lifts a lockout at once.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("RANKWISE_LOGIN_FAILURE_LIMIT", 10)
if AXES_FAILURE_LIMIT < 1:
    raise ImproperlyConfigured("RANKWISE_LOGIN_FAILURE_LIMIT must be at least 1.")
AXES_COOLOFF_TIME = timedelta(minutes=env_int("RANKWISE_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# The audit trail records logins, failures and lockouts (nodes.signals): no second log of them.
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "nodes:node-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
try:
    zoneinfo.ZoneInfo(TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    raise ImproperlyConfigured(f"TIME_ZONE={TIME_ZONE!r} is not a time zone name.") from None
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = STATE_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve straight from the app and project static folders, so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# Celery: Redis is the broker and the result store.
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
# kombu's Redis transport, patched so a worker survives a Redis restart (see the module).
CELERY_BROKER_TRANSPORT = "controlpanel.celery_transport:Transport"
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 3600)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A web request that enqueues a task must not hang when Redis is down: fail within seconds.
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 1,
}
CELERY_REDIS_SOCKET_CONNECT_TIMEOUT = 2
# Sending a task also subscribes to its result in Redis; Celery's default there is 20 retries a
# second apart (a 19 s hang per request with Redis down). Three within 1.5 s, then the error.
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {
    "retry_policy": {"max_retries": 3, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
}
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 2, "socket_timeout": 10}
CELERY_BEAT_SCHEDULE_FILENAME = str(STATE_DIR / "celerybeat-schedule")
# Seconds between heartbeats (each node's reachability, GPU memory in use, MemAvailable).
RANKWISE_HEARTBEAT_SECONDS = env_int("RANKWISE_HEARTBEAT_SECONDS", 30)
# Launches: a follower that has not checked in for this many seconds is presumed dead and its
# launch is re-adopted by the reconciler (which also runs every RECONCILE seconds).
RANKWISE_FOLLOWER_LEASE_SECONDS = env_int("RANKWISE_FOLLOWER_LEASE_SECONDS", 15)
RANKWISE_RECONCILE_SECONDS = env_int("RANKWISE_RECONCILE_SECONDS", 20)
# A launch whose node does not answer for this long becomes `lost` (and recovers when it does).
RANKWISE_LOST_AFTER_SECONDS = env_int("RANKWISE_LOST_AFTER_SECONDS", 30)
# Live log streams one user may hold open at once (per panel process): a page follows one.
RANKWISE_STREAMS_PER_USER = env_int("RANKWISE_STREAMS_PER_USER", 8)
# Start-up must reach `ready` within this (the CLI's --timeout sets it per launch).
RANKWISE_STARTUP_TIMEOUT_SECONDS = env_int("RANKWISE_STARTUP_TIMEOUT_SECONDS", 1800)
# Seconds between /health polls of a ready server (and /metrics with --enable-metrics).
RANKWISE_HEALTH_SECONDS = env_int("RANKWISE_HEALTH_SECONDS", 10)
# Log lines kept in the database per launch (the first 1,000 and the newest); the full log is
# archived with the launch when it ends and stays downloadable. The viewer reads by sequence
# number and searches on the server, so a million lines (about 150 MB) stay quick to browse.
RANKWISE_LOG_LINES_MAX = env_int("RANKWISE_LOG_LINES_MAX", 1_000_000)
# Seconds a stop waits after SIGTERM before SIGKILL.
RANKWISE_STOP_GRACE_SECONDS = env_int("RANKWISE_STOP_GRACE_SECONDS", 20)
# A stop the node did not take (unreachable) is retried this many times, the first after this
# many seconds, doubling up to 120 s (about 9 minutes in all), then reported failed.
RANKWISE_STOP_RETRIES = env_int("RANKWISE_STOP_RETRIES", 8)
RANKWISE_STOP_RETRY_SECONDS = env_int("RANKWISE_STOP_RETRY_SECONDS", 5)
# Teams with an e-mail address are also e-mailed their launch events from this address (Django's
# EMAIL_* settings say how); empty: no e-mail, webhooks only.
RANKWISE_NOTIFY_EMAIL_FROM = env_str("RANKWISE_NOTIFY_EMAIL_FROM", "")
# The mail server it goes through (Django's SMTP settings); the password also from a file
# (EMAIL_HOST_PASSWORD_FILE), as a secret is best kept out of the environment.
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "") or env_file("EMAIL_HOST_PASSWORD_FILE")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL: set one of them, not both")
# A revision is stamped known-good on a node once a launch of it stayed healthy this long.
RANKWISE_KNOWN_GOOD_SECONDS = env_int("RANKWISE_KNOWN_GOOD_SECONDS", 600)
# How often host RAM and GPU memory are sampled while a launch starts (its memory timeline).
RANKWISE_MEMORY_SAMPLE_SECONDS = env_int("RANKWISE_MEMORY_SAMPLE_SECONDS", 2)
# How long saving a profile waits for a worker to read its model on the node (pages that only
# show the budget never wait: they poll).
RANKWISE_MODEL_READ_WAIT_SECONDS = env_int("RANKWISE_MODEL_READ_WAIT_SECONDS", 30)
# Long-lived followers and the pages' short readings of a node run on the thread-pool worker:
# they wait on SSH, and must not take the slots that starts, stops and cleanups need.
CELERY_TASK_ROUTES = {
    name: {"queue": "streams"}
    for name in ("nodes.follow_launch", "nodes.read_model", "nodes.read_holders")
}
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "heartbeat": {"task": "nodes.heartbeat", "schedule": float(RANKWISE_HEARTBEAT_SECONDS)},
    "reconcile-launches": {
        "task": "nodes.reconcile_launches",
        "schedule": float(RANKWISE_RECONCILE_SECONDS),
    },
}

# The account management commands act as when neither --actor nor RANKWISE_ACTOR names one.
RANKWISE_CLI_USER = "cli"

LOG_LEVEL = env_str("LOG_LEVEL", "INFO").strip().upper()
if LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ImproperlyConfigured(f"LOG_LEVEL={LOG_LEVEL!r}: use DEBUG, INFO, WARNING or ERROR.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # 403/404 are answered to the user; a traceback per refusal would only bury real errors.
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "django.request": {"level": "ERROR"},
        # paramiko logs every connection, and every failed one with a traceback; Rankwise turns
        # those failures into RemoteError messages itself.
        "paramiko": {"level": "CRITICAL"},
        # django-axes says INFO on every login; the audit trail keeps logins, failures and
        # lockouts, and its warnings (a lockout) still show.
        "axes": {"level": "WARNING"},
    },
}
