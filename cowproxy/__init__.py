"""The ``cowproxy`` command and what every package of the project shares.

Layers, each importing only from those below it:

- ``cowproxy.main``: the umbrella command line (``cowproxy``), which collects the sub-commands of ``demo``,
  ``scoring``, ``proxy`` and ``migrations``;
- ``demo`` (uses the three below), then ``scoring``, ``proxy`` and ``migrations``;
- ``cowproxy.errors`` (the root error), ``cowproxy.ids`` (the session id rule) and ``cowproxy.cli`` (the
  shared command-line plumbing: ``--dsn``, ``--format``, errors as one line).

This module imports nothing, so that the packages below can use the bottom layer without loading the rest.
"""
