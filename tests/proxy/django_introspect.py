"""What Django's ``connection.introspection`` says about a database, as JSON, run by ``test_introspection.py``
in a process of its own (Django's settings are per process). ``inspectdb``, the migration autodetector and the
test runner's flush and sequence reset all read these answers.

    python django_introspect.py URL
"""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import parse_qs, urlsplit

import django
from django.conf import settings


def _configure(url: str) -> None:
    parts = urlsplit(url)
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": parts.path.lstrip("/"),
                "USER": parts.username or "postgres",
                "HOST": parts.hostname,
                "PORT": str(parts.port),
                "OPTIONS": options,
            }
        },
        INSTALLED_APPS=["django.contrib.contenttypes"],
        USE_TZ=True,
    )
    django.setup()


def _describe(cursor: Any, introspection: Any, table: str) -> dict[str, Any]:
    return {
        "columns": [
            [c.name, c.type_code, c.null_ok, c.default, c.is_autofield]
            for c in introspection.get_table_description(cursor, table)
        ],
        "primary_key": introspection.get_primary_key_column(cursor, table),
        "primary_key_columns": introspection.get_primary_key_columns(cursor, table),
        "sequences": introspection.get_sequences(cursor, table),
        "relations": {k: list(v) for k, v in sorted(introspection.get_relations(cursor, table).items())},
        "constraints": {
            name: {k: v for k, v in sorted(c.items())}
            for name, c in sorted(introspection.get_constraints(cursor, table).items())
        },
    }


def main(url: str) -> None:
    _configure(url)
    from django.core.management.color import no_style
    from django.db import connection

    introspection = connection.introspection
    with connection.cursor() as cursor:
        tables = [[t.name, t.type] for t in introspection.get_table_list(cursor)]
        found: dict[str, Any] = {
            "tables": sorted(tables),
            "table_names": introspection.table_names(cursor, include_views=True),
            "described": {name: _describe(cursor, introspection, name) for name, _ in sorted(tables)},
        }
        # The test runner's flush resets sequences by name: setval(NULL, …) if the sequence is not found.
        resets = connection.ops.sequence_reset_by_name_sql(no_style(), [{"table": "authors", "column": "id"}])
        found["sequence_reset"] = [cursor.execute(sql).fetchall() for sql in resets]
    json.dump(found, sys.stdout, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
