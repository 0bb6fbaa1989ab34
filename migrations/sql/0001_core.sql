-- cowproxy copy-on-write layer, core (version 1): schemas, tables, sequence, grants.
-- Everything the layer creates lives in schema cow, in the changes schema cow_changes and in one overlay schema
-- per app schema; app tables only get a statement-level guard trigger. The layer's functions are not in the
-- numbered files: they live in the repeatable files functions/*.sql, which `install` applies after these.

CREATE SCHEMA IF NOT EXISTS cow;
CREATE SCHEMA IF NOT EXISTS cow_changes;

-- Orders every write of every session (never now(): same-transaction writes must not tie).
CREATE SEQUENCE IF NOT EXISTS cow.write_seq;

CREATE TABLE IF NOT EXISTS cow.schemas (
    schema_name    text PRIMARY KEY,
    overlay_schema text NOT NULL UNIQUE,
    excluded       text[] NOT NULL DEFAULT '{}'
);

CREATE TABLE IF NOT EXISTS cow.registry (
    id             serial PRIMARY KEY,
    relid          oid NOT NULL UNIQUE,
    table_schema   text NOT NULL,
    table_name     text NOT NULL,
    overlay_schema text NOT NULL,
    changes_table  text NOT NULL UNIQUE,
    pk_columns     text[] NOT NULL,
    col_attnums    int[] NOT NULL DEFAULT '{}',
    col_names      text[] NOT NULL DEFAULT '{}',
    col_types      text[] NOT NULL DEFAULT '{}',
    signature      text,
    UNIQUE (table_schema, table_name)
);

CREATE OR REPLACE VIEW cow.tables AS
SELECT table_schema, table_name, overlay_schema, pk_columns
FROM cow.registry ORDER BY table_schema, table_name;

CREATE TABLE IF NOT EXISTS cow.sessions (
    session_id     text PRIMARY KEY CHECK (session_id ~ '^[A-Za-z0-9._:-]{1,128}$'),
    kind           text NOT NULL DEFAULT 'other' CHECK (kind IN ('ground_truth', 'agent', 'other')),
    label          text,
    prompt         text,
    model          text,
    gt_session     text,
    metadata       jsonb NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL DEFAULT now(),
    first_write_at timestamptz,
    last_write_at  timestamptz,
    status         text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'committed', 'discarded'))
);

-- The generated triggers run with the privileges of the writing role (no SECURITY DEFINER: a definer function
-- would run app-supplied search_path lookups as the installer), so every role may write the changes tables.
GRANT USAGE ON SCHEMA cow, cow_changes TO PUBLIC;
GRANT SELECT, INSERT, UPDATE ON cow.sessions TO PUBLIC;
GRANT USAGE, SELECT ON SEQUENCE cow.write_seq TO PUBLIC;
GRANT SELECT ON cow.registry, cow.schemas, cow.tables TO PUBLIC;
