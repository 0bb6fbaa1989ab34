"""The test suite's fixtures, registered as plugins (one ``tests/fix_*.py`` module per area).

- ``fix_db``: a real PostgreSQL (``pg_server``), ``create_database``, ``empty_db``, ``install_layer_at``;
- ``fix_layer``: the layer's sample database (``layer_template``, ``layer_db``, ``plain_db``) and old layer
  versions for upgrade tests;
- ``fix_proxy``: a running proxy (``proxy``, ``run_proxy``; ``BOTH_RELAYS = True`` in a module runs its tests
  on the C relay and on the Python relay), ``relay_pair`` (one proxy on each relay, the Python one the
  oracle), ``databases``;
- ``fix_scoring``: the paper's Figure 3 database (``fig3_dsn``), ``record``;
- ``fix_demo``: the demo app's database and API (``seeded_db``, ``app_api``), a scripted model
  (``fake_model``);
- ``fix_containment``: the containment suite's world (``new_world``: a prepared database behind a
  real ``cowproxy serve``, attacked as the superuser or a non-superuser owner).

Every fixture is available to every test: a test module takes it by name and imports from a ``fix_*`` module
only the helpers it calls (``PgServer``, ``RunningProxy``, ``outcome``...), never from a ``conftest.py``.
A new fixture goes in the ``fix_*`` module of its area (or a new one, added here).
"""

from __future__ import annotations

pytest_plugins = [
    "tests.fix_db",
    "tests.fix_layer",
    "tests.fix_proxy",
    "tests.fix_scoring",
    "tests.fix_demo",
    "tests.fix_containment",
]
