-- cowproxy copy-on-write layer, version 6: a counter of session closes. The generated triggers keep the
-- registry check's result for the rest of a connection (cow._open_stamp, 10_core.sql) while this counter is
-- unchanged; a trigger on cow.sessions bumps it whenever a session's status changes or a session row goes, so
-- a commit or discard made by any connection sends every writer back to the registry.
CREATE SEQUENCE IF NOT EXISTS cow.session_closes;
GRANT USAGE, SELECT ON SEQUENCE cow.session_closes TO PUBLIC;
