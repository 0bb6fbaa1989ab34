-- cowproxy copy-on-write layer, version 30: the FOREIGN KEY neighbours of each enabled table as of its last
-- trigger build (functions/40_enable.sql, cow._build_linked_triggers). App DDL on one table regenerates the
-- triggers of a neighbour only when the neighbour's signature changed; a neighbour linked before the DDL (a
-- FOREIGN KEY it dropped) is found here, since the catalog no longer links it. NULL: not built since.
-- (Like every numbered file, safe to run again.)
ALTER TABLE cow.registry ADD COLUMN IF NOT EXISTS neighbours oid[];
-- cow._fire_always and cow._rls_sync take the registry entries to work on (functions/40_enable.sql,
-- 38_rls.sql): the signatures without arguments go, or a call without one would fit two overloads.
DROP FUNCTION IF EXISTS cow._fire_always();
DROP FUNCTION IF EXISTS cow._rls_sync();
