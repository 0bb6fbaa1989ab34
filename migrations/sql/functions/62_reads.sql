-- Read traces (cow.reads, migration 50).
-- A session's reads go with its changes: when it is committed or discarded, or its registry row goes.
-- SECURITY DEFINER: whoever may close a session may drop its trace, without rights on cow.reads itself.
CREATE OR REPLACE FUNCTION cow._drop_reads() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM cow.reads WHERE session = OLD.session_id;
    ELSIF NEW.status IN ('committed', 'discarded') THEN
        DELETE FROM cow.reads WHERE session = NEW.session_id;
    END IF;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION cow._drop_reads() FROM PUBLIC;
CREATE OR REPLACE TRIGGER cow_session_reads_closed AFTER UPDATE OF status ON cow.sessions
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION cow._drop_reads();
CREATE OR REPLACE TRIGGER cow_session_reads_gone AFTER DELETE ON cow.sessions
    FOR EACH ROW EXECUTE FUNCTION cow._drop_reads();

-- Rows the proxy's writer adds register their sessions, in the COPY's own statement: the writer sends the
-- COPY alone (autocommit), one exchange a batch instead of BEGIN, COPY, a registration statement and COMMIT
-- (~0.4 ms of the proxy's CPU a batch: docs/benchmarks.md, "Read traces: one exchange a batch"). A session
-- that only reads is a session, registered as the layer registers one at its first write; rows added after
-- their session was committed or discarded go, as its trace went then.
CREATE OR REPLACE FUNCTION cow._register_reads() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    WITH added AS (SELECT DISTINCT session FROM added_reads),
    registered AS (
        INSERT INTO cow.sessions (session_id) SELECT session FROM added ON CONFLICT (session_id) DO NOTHING
    )
    DELETE FROM cow.reads r USING cow.sessions s, added
    WHERE s.session_id = added.session AND s.status <> 'open' AND r.session = s.session_id;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION cow._register_reads() FROM PUBLIC;
CREATE OR REPLACE TRIGGER cow_reads_register AFTER INSERT ON cow.reads
    REFERENCING NEW TABLE AS added_reads FOR EACH STATEMENT EXECUTE FUNCTION cow._register_reads();
