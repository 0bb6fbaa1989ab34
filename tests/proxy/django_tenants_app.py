"""A django-tenants application, run by ``test_django_tenants.py`` in a process of its own (Django's settings
are per process): two tenants in schemas of their own, requests that switch the tenant with django-tenants'
``connection.set_schema`` (its backend sends ``SET search_path = <tenant>,public`` before the queries), ORM
writes and reads. Prints what each request read, as JSON.

    python django_tenants_app.py HOST PORT DATABASE SESSION
"""

from __future__ import annotations

import json
import sys

import django
from django.conf import settings


def main(host: str, port: str, name: str, session: str) -> None:
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django_tenants.postgresql_backend",
                "NAME": name,
                "USER": "postgres",
                "HOST": host,
                "PORT": port,
                "OPTIONS": {"options": f"-c cow.session_id={session}"},
            }
        },
        INSTALLED_APPS=["django.contrib.contenttypes"],
        USE_TZ=True,
    )
    django.setup()
    from django.db import connection, models, transaction

    class Item(models.Model):
        name = models.TextField()
        qty = models.IntegerField(default=0)

        class Meta:
            app_label = "tenancy"
            db_table = "shop_item"
            managed = False

    reads: dict[str, list[list[list[object]]]] = {}

    def read(tenant: str) -> None:
        connection.set_schema(tenant)
        rows = [[n, q] for n, q in Item.objects.order_by("id").values_list("name", "qty")]
        reads.setdefault(tenant, []).append(rows)

    # one "request" per tenant, each switching the schema first, as django-tenants' middleware does
    for tenant, names in (("tenant_a", ["apple", "avocado"]), ("tenant_b", ["banana"])):
        connection.set_schema(tenant)
        with transaction.atomic():
            for item in names:
                Item.objects.create(name=item, qty=1)
            Item.objects.filter(name=names[0]).update(qty=models.F("qty") + 5)
    read("tenant_a")
    read("tenant_b")
    connection.set_schema("tenant_b")
    Item.objects.filter(name="seed b").delete()
    read("tenant_b")
    read("tenant_a")
    connection.set_schema_to_public()
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('cow.app_search_path')")
        reads["public path"] = [[list(cursor.fetchone())]]
    print(json.dumps(reads))


if __name__ == "__main__":
    main(*sys.argv[1:5])
