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
