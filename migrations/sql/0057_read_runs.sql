-- cowproxy copy-on-write layer, version 57: the proxy stores a run of one session's reads as one row. The
-- C relay hands its records over in takes of ~1,024 of one connection, already encoded as binary COPY rows
-- of cow.reads (proxy/reads.py, COPY_COLUMNS); a row of cow.read_runs keeps such a run as it came (`data`),
-- so the heap tuple, the key entry, the CHECK and the registration trigger are paid once per run instead of
-- once per read (~2.7 µs of the server's CPU per read on PostgreSQL 15: docs/benchmarks.md, "Read traces:
-- a run of reads a row"). Readers keep one row per read: cow.reads becomes a view (functions/62_reads.sql)
-- over the rows written one by one before (kept, in cow.read_rows) and the runs, unpacked.
DO $$
BEGIN
    IF pg_catalog.to_regclass('cow.read_rows') IS NULL THEN  -- (run again on layer 57: done already)
        ALTER TABLE cow.reads RENAME TO read_rows;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS cow.read_runs (
    session  text NOT NULL CHECK (session ~ '^[A-Za-z0-9._:-]+$' AND length(session) <= 128),
    -- one order for runs and rows: the readers' seq is this times 65,536 plus the read's place in the run
    seq      bigint NOT NULL DEFAULT nextval('cow.reads_seq_seq'),
    reads    integer NOT NULL CHECK (reads BETWEEN 1 AND 65535),
    data     bytea NOT NULL,  -- `reads` binary COPY rows of COPY_COLUMNS, without COPY's header and trailer
    CONSTRAINT read_runs_pkey PRIMARY KEY (session, seq)
);
-- A run is ~200 bytes a read, mostly repeated texts. lz4 compresses it several times over for less than it
-- saves (TOAST chunks, their index entries and WAL: ~0.3 against ~1.1 µs of the server's CPU a read on
-- PostgreSQL 15, and a fifth of the WAL); pglz costs more than it saves (~1.5 µs), so a server built without
-- lz4 stores the run out of line as it is.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_settings
               WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE cow.read_runs ALTER COLUMN data SET COMPRESSION lz4;
    ELSE
        ALTER TABLE cow.read_runs ALTER COLUMN data SET STORAGE EXTERNAL;
    END IF;
END $$;
REVOKE ALL ON cow.read_runs FROM PUBLIC;
-- The view cow.reads, its INSERT trigger and the triggers of both tables: functions/62_reads.sql.
