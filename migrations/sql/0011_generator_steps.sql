-- cowproxy copy-on-write layer, version 11: the generators' context carries what the collecting steps of
-- 30_generators.sql pass on to each other (cow._trigger_context, cow._key_checks, cow._fk_child_checks,
-- cow._fk_parent_checks), cow._fk_child_checks takes that context instead of eight arguments, and
-- cow._build_triggers builds the triggers of keyless tables too.
-- (Like every numbered file, safe to run again.)
DO $$
DECLARE
    field text[];
BEGIN
    FOREACH field SLICE 1 IN ARRAY ARRAY[
            ['sch', 'text'],          -- the app table's schema and name, unquoted (error fields, messages)
            ['tab', 'text'],
            ['row_version', 'text'],  -- the version a constraint trigger checks (changes table row `c`)
            ['fk_checks', 'text'],    -- FOREIGN KEY checks at the end of the statement (cow_fk_check)
            ['dn', 'int'],            -- deferrable constraints: how many, their checks of one version
            ['dq', 'text'],           -- (`dq`) and of the statement's versions (`dq_stmt`), and their
            ['dq_stmt', 'text'],      -- constraint triggers (`dtrg`, cow._defer_trigger)
            ['dtrg', 'jsonb']] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'cow.trigger_context'::regclass
                       AND attname = field[1] AND NOT attisdropped) THEN
            EXECUTE format('ALTER TYPE cow.trigger_context ADD ATTRIBUTE %I %s', field[1], field[2]);
        END IF;
    END LOOP;
END $$;

-- cow._fk_child_checks took the table's parts and the deferrable constraints' state as eight arguments.
DROP FUNCTION IF EXISTS cow._fk_child_checks(oid, text, text, text, int, text, text, jsonb);
-- cow._build_triggers builds keyless tables too.
DROP FUNCTION IF EXISTS cow._kl_build_triggers(int);
