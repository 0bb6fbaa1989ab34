-- Read traces (cow.reads: migration 50; from migration 57 a view over cow.read_rows and cow.read_runs).
-- A session's reads go with its changes: when it is committed or discarded, or its registry row goes.
-- SECURITY DEFINER: whoever may close a session may drop its trace, without rights on the tables themselves.
CREATE OR REPLACE FUNCTION cow._drop_reads() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM cow.read_rows WHERE session = OLD.session_id;
        DELETE FROM cow.read_runs WHERE session = OLD.session_id;
    ELSIF NEW.status IN ('committed', 'discarded') THEN
        DELETE FROM cow.read_rows WHERE session = NEW.session_id;
        DELETE FROM cow.read_runs WHERE session = NEW.session_id;
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
-- their session was committed or discarded go, as its trace went then. One function for both tables (their
-- transition tables share the name and the column `session`).
CREATE OR REPLACE FUNCTION cow._register_reads() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO cow.sessions (session_id) SELECT DISTINCT session FROM added_reads
    ON CONFLICT (session_id) DO NOTHING;
    IF EXISTS (
        SELECT 1 FROM cow.sessions s
        WHERE s.session_id IN (SELECT session FROM added_reads) AND s.status <> 'open'
    ) THEN
        DELETE FROM cow.read_rows r USING cow.sessions s
        WHERE s.session_id IN (SELECT session FROM added_reads) AND s.status <> 'open'
          AND r.session = s.session_id;
        DELETE FROM cow.read_runs r USING cow.sessions s
        WHERE s.session_id IN (SELECT session FROM added_reads) AND s.status <> 'open'
          AND r.session = s.session_id;
    END IF;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION cow._register_reads() FROM PUBLIC;
CREATE OR REPLACE TRIGGER cow_reads_register AFTER INSERT ON cow.read_rows
    REFERENCING NEW TABLE AS added_reads FOR EACH STATEMENT EXECUTE FUNCTION cow._register_reads();
CREATE OR REPLACE TRIGGER cow_read_runs_register AFTER INSERT ON cow.read_runs
    REFERENCING NEW TABLE AS added_reads FOR EACH STATEMENT EXECUTE FUNCTION cow._register_reads();

-- The reads of a run (cow.read_runs.data), one row each, in order: a dictionary run (the C relay's takes:
-- cow._dict_run_reads), else binary COPY rows of the proxy's COPY_COLUMNS (proxy/reads.py; the Python relay's
-- runs, and every run of a proxy before the dictionary runs). Only readers pay for unpacking (~10 µs a read
-- on PostgreSQL 15); the writer's COPY pays a run's row once. The session field is the run's own and is
-- skipped.
CREATE OR REPLACE FUNCTION cow._run_reads(data bytea)
RETURNS TABLE (ord integer, fingerprint text, relations text[], statement text, operation text,
               at timestamptz, params bytea, rows bigint, duration_us bigint)
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- (a value of its own: a TOASTed argument would be fetched again at every get_byte)
    d bytea := data || '\x'::bytea;
    p integer := 0;
    stop integer := length(data);
    n integer;
    head bytea;
    last_head bytea;
    last_relations text[];
BEGIN
    IF stop >= 2 AND get_byte(d, 0) = 255 AND get_byte(d, 1) = 254 THEN  -- (proxy/reads.py, DICT_MARK)
        RETURN QUERY SELECT * FROM cow._dict_run_reads(d);
        RETURN;
    END IF;
    ord := 0;
    WHILE p < stop LOOP
        ord := ord + 1;
        p := p + 2;  -- (the field count)
        n := cow._int4_at(d, p);
        fingerprint := convert_from(substring(d FROM p + 5 FOR n), 'UTF8');
        p := p + 4 + n;
        n := cow._int4_at(d, p);
        head := substring(d FROM p + 5 FOR n);
        IF head IS DISTINCT FROM last_head THEN  -- (a run repeats its statements' tables)
            last_head := head;
            last_relations := cow._text_array_recv(head);
        END IF;
        relations := last_relations;
        p := p + 4 + n;
        n := cow._int4_at(d, p);
        statement := convert_from(substring(d FROM p + 5 FOR n), 'UTF8');
        p := p + 4 + n;
        p := p + 4 + cow._int4_at(d, p);  -- (the session: the run's)
        n := cow._int4_at(d, p);
        operation := CASE WHEN n >= 0 THEN convert_from(substring(d FROM p + 5 FOR n), 'UTF8') END;
        p := p + 4 + greatest(n, 0);
        at := cow._pg_time(cow._int8_at(d, p + 4));
        p := p + 12;
        n := cow._int4_at(d, p);
        params := CASE WHEN n >= 0 THEN substring(d FROM p + 5 FOR n) END;
        p := p + 4 + greatest(n, 0);
        n := cow._int4_at(d, p);
        rows := CASE WHEN n >= 0 THEN cow._int8_at(d, p + 4) END;
        p := p + 4 + greatest(n, 0);
        duration_us := cow._int8_at(d, p + 4);
        p := p + 12;
        RETURN NEXT;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION cow._run_reads(bytea) FROM PUBLIC;

-- A dictionary run (proxy/reads.py, DICT_RUN: the C relay's takes): its statements once (fingerprint, tables,
-- text: NULL when each read brings its own), then an entry per read naming one. Its existence tells the
-- proxy's writer that this layer reads such runs (proxy/reads.py, _LAYER_FEATURES).
CREATE OR REPLACE FUNCTION cow._dict_run_reads(d bytea)
RETURNS TABLE (ord integer, fingerprint text, relations text[], statement text, operation text,
               at timestamptz, params bytea, rows bigint, duration_us bigint)
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p integer;
    stop integer := length(d);
    n integer;
    k integer;
    read_ids text;
    prints text[] := '{}';
    heads bytea[] := '{}';
    texts text[] := '{}';
    last_k integer := -1;
    last_relations text[];
BEGIN
    n := cow._int4_at(d, 2);
    read_ids := convert_from(substring(d FROM 7 FOR greatest(n, 0)), 'UTF8');
    p := 6 + greatest(n, 0);
    k := (get_byte(d, p) << 8) | get_byte(d, p + 1);
    p := p + 2;
    FOR i IN 1 .. k LOOP
        n := cow._int4_at(d, p);
        prints := prints || convert_from(substring(d FROM p + 5 FOR n), 'UTF8');
        p := p + 4 + n;
        n := cow._int4_at(d, p);
        heads := heads || substring(d FROM p + 5 FOR n);
        p := p + 4 + n;
        n := cow._int4_at(d, p);
        texts := texts || CASE WHEN n >= 0 THEN convert_from(substring(d FROM p + 5 FOR n), 'UTF8') END;
        p := p + 4 + greatest(n, 0);
    END LOOP;
    ord := 0;
    WHILE p < stop LOOP
        ord := ord + 1;
        k := ((get_byte(d, p) << 8) | get_byte(d, p + 1)) + 1;
        IF k <> last_k THEN  -- (a run repeats its statements' tables)
            last_k := k;
            last_relations := cow._text_array_recv(heads[k]);
        END IF;
        fingerprint := prints[k];
        relations := last_relations;
        n := cow._int4_at(d, p + 2);
        p := p + 6;
        IF n >= 0 THEN
            operation := convert_from(substring(d FROM p + 1 FOR n), 'UTF8');
            p := p + n;
        ELSIF n = -1 THEN
            operation := NULL;
        ELSIF n = -3 THEN
            operation := read_ids || '.' || cow._int8_at(d, p);
            p := p + 8;
        END IF;  -- (-2: the previous entry's)
        at := cow._pg_time(cow._int8_at(d, p));
        n := cow._int4_at(d, p + 8);
        params := CASE WHEN n >= 0 THEN substring(d FROM p + 13 FOR n) END;
        p := p + 12 + greatest(n, 0);
        rows := nullif(cow._int8_at(d, p), -1);
        duration_us := cow._int8_at(d, p + 8);
        p := p + 16;
        statement := texts[k];
        IF statement IS NULL THEN
            n := cow._int4_at(d, p);
            statement := convert_from(substring(d FROM p + 5 FOR n), 'UTF8');
            p := p + 4 + n;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION cow._dict_run_reads(bytea) FROM PUBLIC;

-- Big-endian integers and PostgreSQL's binary timestamp (µs since 2000-01-01 UTC) at a 0-based offset, and
-- a binary one-dimensional text[] (none: empty), as COPY's binary format writes them.
CREATE OR REPLACE FUNCTION cow._int4_at(d bytea, p integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT RETURN
    (get_byte(d, p) << 24) | (get_byte(d, p + 1) << 16) | (get_byte(d, p + 2) << 8) | get_byte(d, p + 3);
CREATE OR REPLACE FUNCTION cow._int8_at(d bytea, p integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT RETURN ('x' || encode(substring(d FROM p + 1 FOR 8), 'hex'))::bit(64)::bigint;
-- (whole seconds and the µs apart: each product stays exact in interval's float multiplication)
CREATE OR REPLACE FUNCTION cow._pg_time(us bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT RETURN timestamptz '2000-01-01 00:00:00+00'
    + (us / 1000000) * interval '1 second' + (us % 1000000) * interval '1 microsecond';
CREATE OR REPLACE FUNCTION cow._text_array_recv(a bytea) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    out text[] := '{}';
    k integer := 20;  -- (dimensions, flags, element type, length and lower bound)
    n integer;
BEGIN
    IF cow._int4_at(a, 0) = 0 THEN
        RETURN out;
    END IF;
    WHILE k < length(a) LOOP
        n := cow._int4_at(a, k);
        out := out || convert_from(substring(a FROM k + 5 FOR n), 'UTF8');
        k := k + 4 + n;
    END LOOP;
    RETURN out;
END $$;

-- One row per read, as cow.reads was a table (docs/interfaces.md): the rows written one by one (before
-- layer 57, or inserted by hand) and the runs' reads. seq orders both: a row's seq and a run's, times
-- 65,536, plus the read's place in its run.
CREATE OR REPLACE VIEW cow.reads AS
SELECT r.seq << 16 AS seq, r.session, r.operation, r.at, r.fingerprint, r.statement, r.identity,
       r.relations, r.rows, r.duration_us, r.params
FROM cow.read_rows r
UNION ALL
SELECT (u.seq << 16) + x.ord, u.session, x.operation, x.at, x.fingerprint, x.statement, NULL::text,
       x.relations, x.rows, x.duration_us, x.params
FROM cow.read_runs u CROSS JOIN LATERAL cow._run_reads(u.data) x;
REVOKE ALL ON cow.reads FROM PUBLIC;
ALTER VIEW cow.reads ALTER COLUMN relations SET DEFAULT '{}';

-- A row inserted into the view (by hand, or by an older proxy's writer) goes to cow.read_rows, checked there,
-- and registers its session through that table's trigger. The trigger's name is the one a proxy before
-- layer 57 looks for on cow.reads (proxy/reads.py, _LAYER_FEATURES): it then sends its COPY alone, as it did.
CREATE OR REPLACE FUNCTION cow._insert_read() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO cow.read_rows (session, operation, at, fingerprint, statement, identity, relations, rows,
                               duration_us, params)
    VALUES (NEW.session, NEW.operation, NEW.at, NEW.fingerprint, NEW.statement, NEW.identity, NEW.relations,
            NEW.rows, NEW.duration_us, NEW.params);
    RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION cow._insert_read() FROM PUBLIC;
CREATE OR REPLACE TRIGGER cow_reads_register INSTEAD OF INSERT ON cow.reads
    FOR EACH ROW EXECUTE FUNCTION cow._insert_read();
