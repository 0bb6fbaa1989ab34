-- cowproxy copy-on-write layer: the event triggers that keep the overlay in step with app DDL.
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).

-- Event triggers: app DDL goes through; the overlay follows.
CREATE OR REPLACE FUNCTION cow._ddl_start() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $gen$
DECLARE
    x record;
BEGIN
    IF current_setting('cow.in_layer', true) = 'on' THEN
        RETURN;
    END IF;
    -- The overlay views depend on the base columns: drop them so that DROP COLUMN, ALTER COLUMN TYPE and
    -- DROP TABLE of the app are not blocked; ddl_command_end recreates them (the changes tables stay).
    IF tg_tag IN ('ALTER TABLE', 'DROP TABLE', 'DROP SCHEMA', 'ALTER SCHEMA', 'ALTER TYPE', 'DROP TYPE', 'ALTER DOMAIN',
                  'DROP DOMAIN', 'DROP SEQUENCE', 'DROP FUNCTION', 'DROP VIEW', 'ALTER VIEW',
                  'DROP MATERIALIZED VIEW', 'DROP COLLATION', 'DROP OWNED') THEN
        PERFORM set_config('cow.in_layer', 'on', true);
        FOR x IN SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname IN (SELECT overlay_schema FROM cow.schemas) AND c.relkind = 'v' LOOP
            EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', x.nspname, x.relname);
        END LOOP;
        PERFORM set_config('cow.in_layer', '', true);
    END IF;
END $gen$;

CREATE OR REPLACE FUNCTION cow._ddl_end() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    note text;
BEGIN
    IF current_setting('cow.in_layer', true) = 'on' THEN
        RETURN;
    END IF;
    IF tg_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'DROP TABLE', 'CREATE INDEX',
                  'DROP INDEX', 'ALTER INDEX', 'CREATE SCHEMA', 'DROP SCHEMA', 'ALTER SCHEMA', 'ALTER TYPE',
                  'DROP TYPE', 'ALTER DOMAIN', 'DROP DOMAIN', 'DROP SEQUENCE', 'DROP FUNCTION', 'CREATE VIEW',
                  'ALTER VIEW', 'DROP VIEW', 'CREATE MATERIALIZED VIEW', 'DROP MATERIALIZED VIEW', 'GRANT',
                  'REVOKE', 'DROP COLLATION', 'DROP OWNED', 'ALTER DEFAULT PRIVILEGES', 'COMMENT',
                  'CREATE POLICY', 'ALTER POLICY', 'DROP POLICY') THEN
        FOR note IN SELECT * FROM cow.refresh() LOOP
            RAISE NOTICE 'cowproxy: %', note;
        END LOOP;
    END IF;
END $gen$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cow_ddl_start') THEN
        CREATE EVENT TRIGGER cow_ddl_start ON ddl_command_start EXECUTE FUNCTION cow._ddl_start();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cow_ddl_end') THEN
        CREATE EVENT TRIGGER cow_ddl_end ON ddl_command_end EXECUTE FUNCTION cow._ddl_end();
    END IF;
END $$;
