-- cowproxy copy-on-write layer, version 6: a counter of session closes, and a generator's new signature.
-- The generated triggers keep the registry check's result for the rest of a connection (cow._open_stamp,
-- 10_core.sql) while this counter is unchanged; a trigger on cow.sessions bumps it whenever a session's status
-- changes or a session row goes, so a commit or discard made by any connection sends every writer back to
-- the registry.
CREATE SEQUENCE IF NOT EXISTS cow.session_closes;
GRANT USAGE, SELECT ON SEQUENCE cow.session_closes TO PUBLIC;

-- cow._rec_code took a tenth argument (snap: where the base snapshot comes from; 30_generators.sql).
DROP FUNCTION IF EXISTS cow._rec_code(text, text, text[], text[], text, boolean, text, text, text);
