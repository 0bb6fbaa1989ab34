-- cowproxy copy-on-write layer, version 56: the generators' probes of the session's view say which columns
-- their condition sets equal, so that a probe by key is written for <t>_cur alone (30_generators.sql,
-- cow._view_exists and cow._live; docs/benchmarks.md, "Trigger plans on small vacuumed tables"). CREATE OR
-- REPLACE cannot change a function's arguments, and a call that fits two overloads is ambiguous: the old
-- signatures go here, the repeatable file defines the new ones, and the upgrade regenerates every table's
-- triggers with them.
DROP FUNCTION IF EXISTS cow._view_exists(text, text, text[], text, text);
DROP FUNCTION IF EXISTS cow._sexists(oid, text);
