"""Settings for Django's own test suite run by tests/peers/django_suite.py (read from the environment).

COWPEER_HOST/PORT/USER/PASSWORD: the server (PostgreSQL itself, or cowproxy in front of it);
COWPEER_PREFIX: the test databases are <prefix>_default and <prefix>_other;
COWPEER_SESSION: when set, every connection is tagged with that session at startup (libpq ``options``);
COWPEER_JOIN_OPTIONS: more startup options of those connections (the session without the proxy: the GUCs
cow.use_session sets, ``-c search_path=…``, set directly on PostgreSQL);
COWPEER_PREPARE: when set, the test runner only creates and migrates the test databases (keepdb).
"""

import os

_SESSION = os.environ.get("COWPEER_SESSION", "")
_JOIN = os.environ.get("COWPEER_JOIN_OPTIONS", "")
_OPTIONS = {"options": f"-c cow.session_id={_SESSION} {_JOIN}".strip()} if _SESSION else {}


def _database(alias: str) -> dict[str, object]:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "HOST": os.environ["COWPEER_HOST"],
        "PORT": os.environ["COWPEER_PORT"],
        "USER": os.environ.get("COWPEER_USER", "postgres"),
        "PASSWORD": os.environ.get("COWPEER_PASSWORD", ""),
        "OPTIONS": dict(_OPTIONS),
        "TEST": {"NAME": f"{os.environ['COWPEER_PREFIX']}_{alias}"},
    }


DATABASES = {"default": _database("default"), "other": _database("other")}
SECRET_KEY = "django_tests_secret_key"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
USE_TZ = False
if os.environ.get("COWPEER_PREPARE"):
    TEST_RUNNER = "cowpeer_prepare.PrepareRunner"
elif _SESSION:
    TEST_RUNNER = "cowpeer_prepare.SessionRunner"
else:
    TEST_RUNNER = "cowpeer_prepare.TimingRunner"
