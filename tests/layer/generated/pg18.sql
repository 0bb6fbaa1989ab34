-- function cow_changes.t1_del()
CREATE OR REPLACE FUNCTION cow_changes.t1_del()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _base jsonb;
    _seen boolean;
    _bad text;
    _pfk int;
    _pseq bigint;
    _porig jsonb;
    _morig jsonb;
    _pdel boolean;
    _cow_k1 record;
    _cow_c record;
    _cow_k2 record;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF _s IS NULL THEN
        DELETE FROM public.child AS y WHERE y.id = OLD.id;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        RETURN OLD;
    END IF;
    _o := cow._write_operation();
    IF pg_catalog.pg_sequence_last_value('cow.row_locks'::pg_catalog.regclass) IS NOT NULL THEN
    DECLARE
        _lh int8 := cow._row_lock_hash(_s, 't1', pg_catalog.jsonb_build_array(OLD.id), 1);
    BEGIN
        PERFORM pg_catalog.pg_advisory_lock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);
        PERFORM pg_catalog.pg_advisory_unlock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);
    END;
    END IF;

    _seen := NULL;
    UPDATE cow_changes.t1 x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND x.id = OLD.id AND ((NOT x._cow_deleted AND x.id IS NOT DISTINCT FROM OLD.id AND x.parent_id IS NOT DISTINCT FROM OLD.parent_id AND x.parent_code IS NOT DISTINCT FROM OLD.parent_code AND x.kept_id IS NOT DISTINCT FROM OLD.kept_id AND x.later_id IS NOT DISTINCT FROM OLD.later_id AND x.up IS NOT DISTINCT FROM OLD.up AND x.fallback_id IS NOT DISTINCT FROM OLD.fallback_id AND x.qty IS NOT DISTINCT FROM OLD.qty AND x.twice IS NOT DISTINCT FROM OLD.twice AND x.slot IS NOT DISTINCT FROM OLD.slot AND x.during IS NOT DISTINCT FROM OLD.during) OR pg_catalog.pg_xact_status(cow._xid8(x.xmin)) IS DISTINCT FROM 'committed')
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    IF _seen IS NULL THEN
        _base := pg_catalog.to_jsonb(OLD);
    END IF;
    INSERT INTO cow_changes.t1 (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, id, parent_id, parent_code, kept_id, later_id, up, fallback_id, qty, twice, slot, during)
    VALUES (_s, _o, true, _base, 0, CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object('id', OLD.id) ELSE _porig END, OLD.id, OLD.parent_id, OLD.parent_code, OLD.kept_id, OLD.later_id, OLD.up, OLD.fallback_id, OLD.qty, OLD.twice, OLD.slot, OLD.during)
    ON CONFLICT (_cow_session, id) WHERE _cow_current DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'could not serialize access due to concurrent update', DETAIL = format('Another transaction of session %s changed the row of "child" with key (id)=(%s) after this statement read it.', _s, concat_ws(', ', coalesce(OLD.id::text, 'null'))), HINT = cow._row_changed_hint(), SCHEMA = 'public', TABLE = 'child';
    END IF;
    RETURN OLD;
END $function$

-- function cow_changes.t1_dfr1()
CREATE OR REPLACE FUNCTION cow_changes.t1_dfr1()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := NEW._cow_session;
    _v bigint := NEW._cow_seq;
    _k int;
    _i int;
    _g text;
    _g0 text;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text;
    _btab text;
    _bsch text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF pg_catalog.pg_trigger_depth() > 1 THEN
        -- IMMEDIATE mode, inside a write: the statement trigger checks at the end of the statement.
        _g := coalesce(pg_catalog.current_setting('cow._dq_t1', true), '');
        FOR _i IN 0 .. TG_NARGS - 1 LOOP
            IF pg_catalog.strpos(_g, ',' || TG_ARGV[_i] || ',') = 0 THEN
                _g := CASE WHEN _g = '' THEN ',' ELSE _g END || TG_ARGV[_i] || ',';
                _g := pg_catalog.set_config('cow._dq_t1', _g, true);
            END IF;
        END LOOP;
        RETURN NULL;
    END IF;
    -- At COMMIT or SET CONSTRAINTS: the checks read the session that wrote the version.
    _g0 := pg_catalog.current_setting('cow.session_id', true);
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', _s, true);  -- (_g: the flags above, unused from here)
    END IF;
    FOR _i IN 0 .. TG_NARGS - 1 LOOP
        _k := TG_ARGV[_i]::int;
    IF _k = 1 THEN
    SELECT c._cow_seq, format('Key (%s)=(%s) already exists.', 'slot', concat_ws(', ', coalesce(c.slot::text, 'null'))) INTO _seq, _det
    FROM cow_changes.t1 c WHERE c._cow_session = _s AND c.id = NEW.id AND c._cow_seq = _v AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.slot IS NOT NULL
        AND (EXISTS (SELECT 1 FROM cow_changes.t1 z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND z.slot = c.slot AND NOT (z.id = c.id) OFFSET 0)
             OR EXISTS (SELECT 1 FROM public.child z WHERE z.slot = c.slot AND NOT (z.id = c.id) AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 y WHERE y._cow_session = _s AND y._cow_current AND y.id = z.id OFFSET 0) OFFSET 0))
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_slot_key'; _bmsg := 'duplicate key value violates unique constraint "child_slot_key"'; _bcode := '23505'; _btab := NULL; _bsch := NULL;
    END IF;
    END IF;
    END LOOP;
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', coalesce(_g0, ''), true);
    END IF;
    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg, DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'child'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t1_dfr2()
CREATE OR REPLACE FUNCTION cow_changes.t1_dfr2()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := NEW._cow_session;
    _v bigint := NEW._cow_seq;
    _k int;
    _i int;
    _g text;
    _g0 text;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text;
    _btab text;
    _bsch text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF pg_catalog.pg_trigger_depth() > 1 THEN
        -- IMMEDIATE mode, inside a write: the statement trigger checks at the end of the statement.
        _g := coalesce(pg_catalog.current_setting('cow._dq_t1', true), '');
        FOR _i IN 0 .. TG_NARGS - 1 LOOP
            IF pg_catalog.strpos(_g, ',' || TG_ARGV[_i] || ',') = 0 THEN
                _g := CASE WHEN _g = '' THEN ',' ELSE _g END || TG_ARGV[_i] || ',';
                _g := pg_catalog.set_config('cow._dq_t1', _g, true);
            END IF;
        END LOOP;
        RETURN NULL;
    END IF;
    -- At COMMIT or SET CONSTRAINTS: the checks read the session that wrote the version.
    _g0 := pg_catalog.current_setting('cow.session_id', true);
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', _s, true);  -- (_g: the flags above, unused from here)
    END IF;
    FOR _i IN 0 .. TG_NARGS - 1 LOOP
        _k := TG_ARGV[_i]::int;
    IF _k = 2 THEN
    IF NEW._cow_deleted IS NOT TRUE AND (NEW._cow_fk & 4) <> 0 AND NEW.later_id IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM cow_changes.t1 c WHERE c._cow_session = _s AND c.id = NEW.id AND c._cow_seq = _v AND c._cow_current) THEN
            IF NOT (EXISTS (SELECT 1 FROM cow_changes.t3 z WHERE z._cow_session = _s AND z._cow_current AND z._cow_deleted IS NOT TRUE AND z.id = NEW.later_id OFFSET 0) OR EXISTS (SELECT 1 FROM public.parent z WHERE z.id = NEW.later_id AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 y WHERE y._cow_session = _s AND y._cow_current AND y.id = z.id OFFSET 0) OFFSET 0)) THEN
                _seq := _v;
                _det := format('Key (%s)=(%s) is not present in table "%s".', 'later_id', concat_ws(', ', coalesce(NEW.later_id::text, 'null')), 'parent');
                IF _best IS NULL OR _seq < _best THEN
                    _best := _seq; _bdet := _det; _bcon := 'child_later_id_fkey'; _bmsg := 'insert or update on table "child" violates foreign key constraint "child_later_id_fkey"'; _bcode := '23503'; _btab := NULL; _bsch := NULL;
                END IF;
            END IF;
        END IF;
    END IF;
    END IF;
    END LOOP;
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', coalesce(_g0, ''), true);
    END IF;
    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg, DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'child'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t1_fkcheck()
CREATE OR REPLACE FUNCTION cow_changes.t1_fkcheck()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text;
    _marks text := current_setting('cow._mark_t1', true);
    _mark bigint;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text := '23503';
    _btab text;
    _bsch text;
    _g text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF coalesce(_marks, '') = '' THEN
        RETURN NULL;
    END IF;
    _mark := split_part(_marks, ',', -1)::bigint;
    _g := set_config('cow._mark_t1', regexp_replace(_marks, ',?[^,]*$', ''), true);
    _s := cow._session();
    IF _s IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is not present in table "%s".', 'fallback_id', concat_ws(', ', coalesce(c.fallback_id::text, 'null')), 'parent')
    INTO _seq, _det FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.fallback_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM cow_overlay_public.parent z WHERE z.id = c.fallback_id) AND (c._cow_fk & 1) <> 0
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_fallback_id_fkey'; _bmsg := 'insert or update on table "child" violates foreign key constraint "child_fallback_id_fkey"'; _bcode := '23503'; _btab := NULL; _bsch := NULL;
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is not present in table "%s".', 'kept_id', concat_ws(', ', coalesce(c.kept_id::text, 'null')), 'parent')
    INTO _seq, _det FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.kept_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM cow_overlay_public.parent z WHERE z.id = c.kept_id) AND (c._cow_fk & 2) <> 0
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_kept_id_fkey'; _bmsg := 'insert or update on table "child" violates foreign key constraint "child_kept_id_fkey"'; _bcode := '23503'; _btab := NULL; _bsch := NULL;
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is not present in table "%s".', 'parent_code', concat_ws(', ', coalesce(c.parent_code::text, 'null')), 'parent')
    INTO _seq, _det FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.parent_code IS NOT NULL AND NOT EXISTS (SELECT 1 FROM cow_overlay_public.parent z WHERE z.code = c.parent_code) AND (c._cow_fk & 8) <> 0
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_parent_code_fkey'; _bmsg := 'insert or update on table "child" violates foreign key constraint "child_parent_code_fkey"'; _bcode := '23503'; _btab := NULL; _bsch := NULL;
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is not present in table "%s".', 'parent_id', concat_ws(', ', coalesce(c.parent_id::text, 'null')), 'parent')
    INTO _seq, _det FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.parent_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM cow_overlay_public.parent z WHERE z.id = c.parent_id) AND (c._cow_fk & 16) <> 0
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_parent_id_fkey'; _bmsg := 'insert or update on table "child" violates foreign key constraint "child_parent_id_fkey"'; _bcode := '23503'; _btab := NULL; _bsch := NULL;
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is not present in table "%s".', 'up', concat_ws(', ', coalesce(c.up::text, 'null')), 'child')
    INTO _seq, _det FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.up IS NOT NULL AND NOT EXISTS (SELECT 1 FROM cow_overlay_public.child z WHERE z.id = c.up) AND NOT (c.id = c.up) AND (c._cow_fk & 32) <> 0
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_up_fkey'; _bmsg := 'insert or update on table "child" violates foreign key constraint "child_up_fkey"'; _bcode := '23503'; _btab := NULL; _bsch := NULL;
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(c.id::text, 'null')), 'child')
    INTO _seq, _det FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted AND c.id IS NOT NULL
        AND CASE WHEN EXISTS (SELECT 1 FROM cow_overlay_public.child k WHERE k.up = c.id) THEN NOT EXISTS (SELECT 1 FROM cow_overlay_public.child z WHERE z.id = c.id) ELSE false END
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_up_fkey'; _bmsg := 'update or delete on table "child" violates foreign key constraint "child_up_fkey" on table "child"'; _bcode := '23503'; _btab := 'child'; _bsch := 'public';
    END IF;
    IF coalesce(pg_catalog.current_setting('cow._dq_t1', true), '') <> '' THEN
        _g := cow_changes.t1_fkdq(_marks, _mark, _best);
    END IF;
    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg,
            DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'child'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t1_fkdq(text,bigint,bigint)
CREATE OR REPLACE FUNCTION cow_changes.t1_fkdq(_marks text, _mark bigint, _best bigint)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    _g text := pg_catalog.current_setting('cow._dq_t1', true);
    _s text;
    _seq bigint;
    _det text;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text;
    _btab text;
    _bsch text;
    _cfg text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF regexp_replace(_marks, ',?[^,]*$', '') = '' THEN
        _cfg := pg_catalog.set_config('cow._dq_t1', '', true);
    END IF;
    _s := cow._session();
    IF pg_catalog.strpos(_g, ',1,') > 0 THEN
    SELECT c._cow_seq, format('Key (%s)=(%s) already exists.', 'slot', concat_ws(', ', coalesce(c.slot::text, 'null'))) INTO _seq, _det
    FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_seq > _mark AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.slot IS NOT NULL
        AND (EXISTS (SELECT 1 FROM cow_changes.t1 z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND z.slot = c.slot AND NOT (z.id = c.id) OFFSET 0)
             OR EXISTS (SELECT 1 FROM public.child z WHERE z.slot = c.slot AND NOT (z.id = c.id) AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 y WHERE y._cow_session = _s AND y._cow_current AND y.id = z.id OFFSET 0) OFFSET 0))
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_slot_key'; _bmsg := 'duplicate key value violates unique constraint "child_slot_key"'; _bcode := '23505'; _btab := NULL; _bsch := NULL;
    END IF;
    END IF;
    IF pg_catalog.strpos(_g, ',2,') > 0 THEN
    SELECT c._cow_seq, format('Key (%s)=(%s) is not present in table "%s".', 'later_id', concat_ws(', ', coalesce(c.later_id::text, 'null')), 'parent')
    INTO _seq, _det FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.later_id IS NOT NULL AND NOT (EXISTS (SELECT 1 FROM cow_changes.t3 z WHERE z._cow_session = _s AND z._cow_current AND z._cow_deleted IS NOT TRUE AND z.id = c.later_id OFFSET 0) OR EXISTS (SELECT 1 FROM public.parent z WHERE z.id = c.later_id AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 y WHERE y._cow_session = _s AND y._cow_current AND y.id = z.id OFFSET 0) OFFSET 0)) AND (c._cow_fk & 4) <> 0
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_later_id_fkey'; _bmsg := 'insert or update on table "child" violates foreign key constraint "child_later_id_fkey"'; _bcode := '23503'; _btab := NULL; _bsch := NULL;
    END IF;
    END IF;
    IF _bmsg IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg,
            DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'child'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t1_ins()
CREATE OR REPLACE FUNCTION cow_changes.t1_ins()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _base jsonb;
    _seen boolean;
    _bad text;
    _pfk int;
    _pseq bigint;
    _porig jsonb;
    _morig jsonb;
    _pdel boolean;
    _cow_k1 record;
    _cow_c record;
    _cow_k2 record;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF pg_catalog.current_setting('cow._d_t1_1', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION USING ERRCODE = '428C9', MESSAGE = 'cannot insert a non-DEFAULT value into column "id"', DETAIL = 'Column "id" is an identity column defined as GENERATED ALWAYS.', HINT = 'Use OVERRIDING SYSTEM VALUE to override.';
    END IF;
    _g := pg_catalog.set_config('cow._d_t1_1', '', true);
    IF pg_catalog.current_setting('cow._d_t1_9', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION USING ERRCODE = '428C9', MESSAGE = 'cannot insert a non-DEFAULT value into column "twice"', DETAIL = 'Column "twice" is a generated column.';
    END IF;
    _g := pg_catalog.set_config('cow._d_t1_9', '', true);
    IF _s IS NULL THEN
        INSERT INTO public.child AS y (id, parent_id, parent_code, kept_id, later_id, up, fallback_id, qty, slot, during) OVERRIDING SYSTEM VALUE VALUES (NEW.id, NEW.parent_id, NEW.parent_code, NEW.kept_id, NEW.later_id, NEW.up, NEW.fallback_id, NEW.qty, NEW.slot, NEW.during) RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
    SELECT ((qty * 2)) INTO NEW.twice FROM (SELECT NEW.id AS id, NEW.parent_id AS parent_id, NEW.parent_code AS parent_code, NEW.kept_id AS kept_id, NEW.later_id AS later_id, NEW.up AS up, NEW.fallback_id AS fallback_id, NEW.qty AS qty, NEW.slot AS slot, NEW.during AS during) AS _x;
    IF NEW.id IS NULL OR NEW.qty IS NULL THEN
        IF NEW.id IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "id" of relation "child" violates not-null constraint', SCHEMA = 'public', TABLE = 'child', COLUMN = 'id';
        END IF;
        IF NEW.qty IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "qty" of relation "child" violates not-null constraint', SCHEMA = 'public', TABLE = 'child', COLUMN = 'qty';
        END IF;
    END IF;
    SELECT CASE WHEN ((qty > 0)) IS FALSE THEN 'child_qty_check' END INTO _bad FROM (SELECT NEW.id AS id, NEW.parent_id AS parent_id, NEW.parent_code AS parent_code, NEW.kept_id AS kept_id, NEW.later_id AS later_id, NEW.up AS up, NEW.fallback_id AS fallback_id, NEW.qty AS qty, NEW.twice AS twice, NEW.slot AS slot, NEW.during AS during) AS _x;
    IF _bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '23514', MESSAGE = format('new row for relation "%s" violates check constraint "%s"', 'child', _bad), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = _bad;
    END IF;
    SELECT c._cow_deleted INTO _pdel FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND c.id = NEW.id;
    IF _pdel IS FALSE OR (_pdel IS NULL AND EXISTS (SELECT 1 FROM public.child z WHERE z.id = NEW.id)) THEN
        RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "child_pkey"', DETAIL = format('Key (%s)=(%s) already exists.', 'id', concat_ws(', ', coalesce(NEW.id::text, 'null'))), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_pkey';
    END IF;
    SELECT true AS p, (during) AS k1 INTO _cow_k1 FROM (SELECT NEW.id AS id, NEW.parent_id AS parent_id, NEW.parent_code AS parent_code, NEW.kept_id AS kept_id, NEW.later_id AS later_id, NEW.up AS up, NEW.fallback_id AS fallback_id, NEW.qty AS qty, NEW.twice AS twice, NEW.slot AS slot, NEW.during AS during) AS _x;
    IF _cow_k1.p IS TRUE AND _cow_k1.k1 IS NOT NULL THEN
        SELECT _y.d INTO _cow_c FROM (SELECT concat_ws(', ', coalesce(((during))::text, 'null')) AS d FROM public.child b WHERE (during) OPERATOR(pg_catalog.&&) _cow_k1.k1 AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND c.id = b.id OFFSET 0) UNION ALL SELECT concat_ws(', ', coalesce(((during))::text, 'null')) AS d FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND NOT c._cow_deleted AND (during) OPERATOR(pg_catalog.&&) _cow_k1.k1) AS _y LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '23P01', MESSAGE = 'conflicting key value violates exclusion constraint "child_during_excl"', DETAIL = format('Key (%s)=(%s) conflicts with existing key (%s)=(%s).', 'during', concat_ws(', ', coalesce(_cow_k1.k1::text, 'null')), 'during', _cow_c.d), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_during_excl';
        END IF;
    END IF;
    SELECT ((qty > 100)) AS p, (qty) AS k1 INTO _cow_k2 FROM (SELECT NEW.id AS id, NEW.parent_id AS parent_id, NEW.parent_code AS parent_code, NEW.kept_id AS kept_id, NEW.later_id AS later_id, NEW.up AS up, NEW.fallback_id AS fallback_id, NEW.qty AS qty, NEW.twice AS twice, NEW.slot AS slot, NEW.during AS during) AS _x;
    IF _cow_k2.p IS TRUE AND _cow_k2.k1 IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM public.child b WHERE ((qty > 100)) AND (qty) OPERATOR(pg_catalog.=) _cow_k2.k1 AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND c.id = b.id OFFSET 0)) OR EXISTS (SELECT 1 FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND NOT c._cow_deleted AND ((qty > 100)) AND (qty) OPERATOR(pg_catalog.=) _cow_k2.k1) THEN
            RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "child_slot_big"', DETAIL = format('Key (%s)=(%s) already exists.', 'qty', concat_ws(', ', coalesce(_cow_k2.k1::text, 'null'))), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_slot_big';
        END IF;
    END IF;
    IF _pdel IS NOT NULL THEN

    _seen := NULL;
    UPDATE cow_changes.t1 x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND x.id = NEW.id
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    END IF;
    INSERT INTO cow_changes.t1 (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, id, parent_id, parent_code, kept_id, later_id, up, fallback_id, qty, twice, slot, during)
    VALUES (_s, _o, false, _base, (0 | CASE WHEN NEW.fallback_id IS NOT NULL THEN 1 ELSE 0 END | CASE WHEN NEW.kept_id IS NOT NULL THEN 2 ELSE 0 END | CASE WHEN NEW.later_id IS NOT NULL THEN 4 ELSE 0 END | CASE WHEN NEW.parent_code IS NOT NULL THEN 8 ELSE 0 END | CASE WHEN NEW.parent_id IS NOT NULL THEN 16 ELSE 0 END | CASE WHEN NEW.up IS NOT NULL THEN 32 ELSE 0 END) | CASE WHEN _pseq > coalesce(nullif(pg_catalog.split_part(pg_catalog.current_setting('cow._mark_t1', true), ',', 1), '')::bigint, 9223372036854775807) THEN coalesce(_pfk, 0) ELSE 0 END, NULL, NEW.id, NEW.parent_id, NEW.parent_code, NEW.kept_id, NEW.later_id, NEW.up, NEW.fallback_id, NEW.qty, NEW.twice, NEW.slot, NEW.during);
    RETURN NEW;
END $function$

-- function cow_changes.t1_mark()
CREATE OR REPLACE FUNCTION cow_changes.t1_mark()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    _g text;
BEGIN
    _g := set_config('cow._mark_t1', concat_ws(',', nullif(current_setting('cow._mark_t1', true), ''),
        coalesce(pg_catalog.pg_sequence_last_value('cow.write_seq'::pg_catalog.regclass), 0)::text), true);
    RETURN NULL;
END $function$

-- function cow_changes.t1_upd()
CREATE OR REPLACE FUNCTION cow_changes.t1_upd()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _base jsonb;
    _seen boolean;
    _bad text;
    _pfk int;
    _pseq bigint;
    _porig jsonb;
    _morig jsonb;
    _pdel boolean;
    _cow_k1 record;
    _cow_c record;
    _cow_k2 record;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id AND pg_catalog.current_setting('cow._d_t1_1', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION USING ERRCODE = '428C9', MESSAGE = 'column "id" can only be updated to DEFAULT', DETAIL = 'Column "id" is an identity column defined as GENERATED ALWAYS.';
    END IF;
    _g := pg_catalog.set_config('cow._d_t1_1', '', true);
    IF NEW.twice IS DISTINCT FROM OLD.twice AND pg_catalog.current_setting('cow._d_t1_9', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION USING ERRCODE = '428C9', MESSAGE = 'column "twice" can only be updated to DEFAULT', DETAIL = 'Column "twice" is a generated column.';
    END IF;
    _g := pg_catalog.set_config('cow._d_t1_9', '', true);
    IF _s IS NULL THEN
        UPDATE public.child AS y SET (parent_id, parent_code, kept_id, later_id, up, fallback_id, qty, slot, during) = ROW(NEW.parent_id, NEW.parent_code, NEW.kept_id, NEW.later_id, NEW.up, NEW.fallback_id, NEW.qty, NEW.slot, NEW.during) WHERE y.id = OLD.id RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
    IF pg_catalog.pg_sequence_last_value('cow.row_locks'::pg_catalog.regclass) IS NOT NULL THEN
    DECLARE
        _lh int8 := cow._row_lock_hash(_s, 't1', pg_catalog.jsonb_build_array(OLD.id), CASE WHEN (NEW.id IS DISTINCT FROM OLD.id) THEN 1 ELSE 2 END);
    BEGIN
        PERFORM pg_catalog.pg_advisory_lock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);
        PERFORM pg_catalog.pg_advisory_unlock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);
    END;
    END IF;
    SELECT ((qty * 2)) INTO NEW.twice FROM (SELECT NEW.id AS id, NEW.parent_id AS parent_id, NEW.parent_code AS parent_code, NEW.kept_id AS kept_id, NEW.later_id AS later_id, NEW.up AS up, NEW.fallback_id AS fallback_id, NEW.qty AS qty, NEW.slot AS slot, NEW.during AS during) AS _x;
    IF NEW.id IS NULL OR NEW.qty IS NULL THEN
        IF NEW.id IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "id" of relation "child" violates not-null constraint', SCHEMA = 'public', TABLE = 'child', COLUMN = 'id';
        END IF;
        IF NEW.qty IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "qty" of relation "child" violates not-null constraint', SCHEMA = 'public', TABLE = 'child', COLUMN = 'qty';
        END IF;
    END IF;
    SELECT CASE WHEN ((qty > 0)) IS FALSE THEN 'child_qty_check' END INTO _bad FROM (SELECT NEW.id AS id, NEW.parent_id AS parent_id, NEW.parent_code AS parent_code, NEW.kept_id AS kept_id, NEW.later_id AS later_id, NEW.up AS up, NEW.fallback_id AS fallback_id, NEW.qty AS qty, NEW.twice AS twice, NEW.slot AS slot, NEW.during AS during) AS _x;
    IF _bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '23514', MESSAGE = format('new row for relation "%s" violates check constraint "%s"', 'child', _bad), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = _bad;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) THEN
        IF NEW.id IS NOT NULL AND (EXISTS (SELECT 1 FROM cow_changes.t1 z WHERE z._cow_session = _s AND z._cow_current AND z._cow_deleted IS NOT TRUE AND z.id = NEW.id AND NOT (z.id = OLD.id) OFFSET 0) OR EXISTS (SELECT 1 FROM public.child z WHERE z.id = NEW.id AND NOT (z.id = OLD.id) AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND c.id = z.id OFFSET 0) OFFSET 0)) THEN
            RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "child_pkey"', DETAIL = format('Key (%s)=(%s) already exists.', 'id', concat_ws(', ', coalesce(NEW.id::text, 'null'))), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_pkey';
        END IF;
    END IF;
    IF (NEW.during IS DISTINCT FROM OLD.during) THEN
    SELECT true AS p, (during) AS k1 INTO _cow_k1 FROM (SELECT NEW.id AS id, NEW.parent_id AS parent_id, NEW.parent_code AS parent_code, NEW.kept_id AS kept_id, NEW.later_id AS later_id, NEW.up AS up, NEW.fallback_id AS fallback_id, NEW.qty AS qty, NEW.twice AS twice, NEW.slot AS slot, NEW.during AS during) AS _x;
    IF _cow_k1.p IS TRUE AND _cow_k1.k1 IS NOT NULL THEN
        SELECT _y.d INTO _cow_c FROM (SELECT concat_ws(', ', coalesce(((during))::text, 'null')) AS d FROM public.child b WHERE (during) OPERATOR(pg_catalog.&&) _cow_k1.k1 AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND c.id = b.id OFFSET 0) AND NOT (b.id = OLD.id) UNION ALL SELECT concat_ws(', ', coalesce(((during))::text, 'null')) AS d FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND NOT c._cow_deleted AND (during) OPERATOR(pg_catalog.&&) _cow_k1.k1 AND NOT (c.id = OLD.id)) AS _y LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '23P01', MESSAGE = 'conflicting key value violates exclusion constraint "child_during_excl"', DETAIL = format('Key (%s)=(%s) conflicts with existing key (%s)=(%s).', 'during', concat_ws(', ', coalesce(_cow_k1.k1::text, 'null')), 'during', _cow_c.d), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_during_excl';
        END IF;
    END IF;
    END IF;
    IF (NEW.qty IS DISTINCT FROM OLD.qty) THEN
    SELECT ((qty > 100)) AS p, (qty) AS k1 INTO _cow_k2 FROM (SELECT NEW.id AS id, NEW.parent_id AS parent_id, NEW.parent_code AS parent_code, NEW.kept_id AS kept_id, NEW.later_id AS later_id, NEW.up AS up, NEW.fallback_id AS fallback_id, NEW.qty AS qty, NEW.twice AS twice, NEW.slot AS slot, NEW.during AS during) AS _x;
    IF _cow_k2.p IS TRUE AND _cow_k2.k1 IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM public.child b WHERE ((qty > 100)) AND (qty) OPERATOR(pg_catalog.=) _cow_k2.k1 AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND c.id = b.id OFFSET 0) AND NOT (b.id = OLD.id)) OR EXISTS (SELECT 1 FROM cow_changes.t1 c WHERE c._cow_session = _s AND c._cow_current AND NOT c._cow_deleted AND ((qty > 100)) AND (qty) OPERATOR(pg_catalog.=) _cow_k2.k1 AND NOT (c.id = OLD.id)) THEN
            RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "child_slot_big"', DETAIL = format('Key (%s)=(%s) already exists.', 'qty', concat_ws(', ', coalesce(_cow_k2.k1::text, 'null'))), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_slot_big';
        END IF;
    END IF;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) AND NOT (NEW.id IS DISTINCT FROM OLD.id) THEN
        IF EXISTS (SELECT 1 FROM cow_overlay_public.child z WHERE z.up = OLD.id) THEN
            RAISE EXCEPTION USING ERRCODE = '23503', MESSAGE = 'update or delete on table "child" violates foreign key constraint "child_up_fkey" on table "child"', DETAIL = format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(OLD.id::text, 'null')), 'child'), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_up_fkey';
        END IF;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) THEN

    _seen := NULL;
    UPDATE cow_changes.t1 x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND x.id = OLD.id AND ((NOT x._cow_deleted AND x.id IS NOT DISTINCT FROM OLD.id AND x.parent_id IS NOT DISTINCT FROM OLD.parent_id AND x.parent_code IS NOT DISTINCT FROM OLD.parent_code AND x.kept_id IS NOT DISTINCT FROM OLD.kept_id AND x.later_id IS NOT DISTINCT FROM OLD.later_id AND x.up IS NOT DISTINCT FROM OLD.up AND x.fallback_id IS NOT DISTINCT FROM OLD.fallback_id AND x.qty IS NOT DISTINCT FROM OLD.qty AND x.twice IS NOT DISTINCT FROM OLD.twice AND x.slot IS NOT DISTINCT FROM OLD.slot AND x.during IS NOT DISTINCT FROM OLD.during) OR pg_catalog.pg_xact_status(cow._xid8(x.xmin)) IS DISTINCT FROM 'committed')
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    IF _seen IS NULL THEN
        _base := pg_catalog.to_jsonb(OLD);
    END IF;
    INSERT INTO cow_changes.t1 (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, id, parent_id, parent_code, kept_id, later_id, up, fallback_id, qty, twice, slot, during)
    VALUES (_s, _o, true, _base, 0, CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object('id', OLD.id) ELSE _porig END, OLD.id, OLD.parent_id, OLD.parent_code, OLD.kept_id, OLD.later_id, OLD.up, OLD.fallback_id, OLD.qty, OLD.twice, OLD.slot, OLD.during)
    ON CONFLICT (_cow_session, id) WHERE _cow_current DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'could not serialize access due to concurrent update', DETAIL = format('Another transaction of session %s changed the row of "child" with key (id)=(%s) after this statement read it.', _s, concat_ws(', ', coalesce(OLD.id::text, 'null'))), HINT = cow._row_changed_hint(), SCHEMA = 'public', TABLE = 'child';
    END IF;
    _morig := CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object('id', OLD.id) ELSE _porig END;
    END IF;

    _seen := NULL;
    UPDATE cow_changes.t1 x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND x.id = NEW.id AND ((NEW.id IS DISTINCT FROM OLD.id) OR ((NOT x._cow_deleted AND x.id IS NOT DISTINCT FROM OLD.id AND x.parent_id IS NOT DISTINCT FROM OLD.parent_id AND x.parent_code IS NOT DISTINCT FROM OLD.parent_code AND x.kept_id IS NOT DISTINCT FROM OLD.kept_id AND x.later_id IS NOT DISTINCT FROM OLD.later_id AND x.up IS NOT DISTINCT FROM OLD.up AND x.fallback_id IS NOT DISTINCT FROM OLD.fallback_id AND x.qty IS NOT DISTINCT FROM OLD.qty AND x.twice IS NOT DISTINCT FROM OLD.twice AND x.slot IS NOT DISTINCT FROM OLD.slot AND x.during IS NOT DISTINCT FROM OLD.during) OR pg_catalog.pg_xact_status(cow._xid8(x.xmin)) IS DISTINCT FROM 'committed'))
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    IF _seen IS NULL THEN
        IF NOT (NEW.id IS DISTINCT FROM OLD.id) THEN
            _base := pg_catalog.to_jsonb(OLD);
        ELSE
            _base := (SELECT pg_catalog.to_jsonb(y.*) FROM public.child y WHERE y.id = NEW.id);
        END IF;
    END IF;
    INSERT INTO cow_changes.t1 (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, id, parent_id, parent_code, kept_id, later_id, up, fallback_id, qty, twice, slot, during)
    VALUES (_s, _o, false, _base, (0 | CASE WHEN (NEW.fallback_id IS DISTINCT FROM OLD.fallback_id) AND NEW.fallback_id IS NOT NULL THEN 1 ELSE 0 END | CASE WHEN (NEW.kept_id IS DISTINCT FROM OLD.kept_id) AND NEW.kept_id IS NOT NULL THEN 2 ELSE 0 END | CASE WHEN (NEW.later_id IS DISTINCT FROM OLD.later_id) AND NEW.later_id IS NOT NULL THEN 4 ELSE 0 END | CASE WHEN (NEW.parent_code IS DISTINCT FROM OLD.parent_code) AND NEW.parent_code IS NOT NULL THEN 8 ELSE 0 END | CASE WHEN (NEW.parent_id IS DISTINCT FROM OLD.parent_id) AND NEW.parent_id IS NOT NULL THEN 16 ELSE 0 END | CASE WHEN (NEW.up IS DISTINCT FROM OLD.up) AND NEW.up IS NOT NULL THEN 32 ELSE 0 END | (coalesce(_pfk, 0) & (0 | 4)) | CASE WHEN (NEW.id IS DISTINCT FROM OLD.id) THEN 0 | 4 ELSE 0 END) | CASE WHEN _pseq > coalesce(nullif(pg_catalog.split_part(pg_catalog.current_setting('cow._mark_t1', true), ',', 1), '')::bigint, 9223372036854775807) THEN coalesce(_pfk, 0) ELSE 0 END, CASE WHEN (NEW.id IS DISTINCT FROM OLD.id) THEN _morig WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object('id', NEW.id) ELSE _porig END, NEW.id, NEW.parent_id, NEW.parent_code, NEW.kept_id, NEW.later_id, NEW.up, NEW.fallback_id, NEW.qty, NEW.twice, NEW.slot, NEW.during)
    ON CONFLICT (_cow_session, id) WHERE _cow_current DO NOTHING;
    IF NOT FOUND THEN
        IF (NEW.id IS DISTINCT FROM OLD.id) THEN
            RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "child_pkey"', DETAIL = format('Key (%s)=(%s) already exists.', 'id', concat_ws(', ', coalesce(NEW.id::text, 'null'))), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_pkey';
        ELSE
            RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'could not serialize access due to concurrent update', DETAIL = format('Another transaction of session %s changed the row of "child" with key (id)=(%s) after this statement read it.', _s, concat_ws(', ', coalesce(OLD.id::text, 'null'))), HINT = cow._row_changed_hint(), SCHEMA = 'public', TABLE = 'child';
        END IF;
    END IF;
    RETURN NEW;
END $function$

-- function cow_changes.t2_del()
CREATE OR REPLACE FUNCTION cow_changes.t2_del()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _bad text;
    _ret bigint;
    _pfk int;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF _s IS NULL THEN
        DELETE FROM public.events AS y WHERE (y.tableoid, y.ctid) = (SELECT _cow_z.tableoid, _cow_z.ctid FROM public.events _cow_z WHERE _cow_z = ROW(OLD.kind, OLD.parent_id, OLD.note)::public.events LIMIT 1);
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        RETURN OLD;
    END IF;
    _o := cow._write_operation();
    _ret := NULL;
    _pfk := NULL;
    UPDATE cow_changes.t2 x SET _cow_current = false WHERE x._cow_current AND x.ctid = (SELECT y.ctid FROM cow_changes.t2 y
        WHERE y._cow_session = _s AND y._cow_current AND NOT y._cow_deleted AND ROW(y.kind, y.parent_id, y.note)::public.events = ROW(OLD.kind, OLD.parent_id, OLD.note)::public.events AND y.kind = OLD.kind ORDER BY y._cow_seq DESC LIMIT 1)
        RETURNING x._cow_seq, x._cow_fk INTO _ret, _pfk;
    INSERT INTO cow_changes.t2 (_cow_session, _cow_op, _cow_deleted, _cow_current, _cow_base, _cow_origin, kind, parent_id, note)
    VALUES (_s, _o, true, _ret IS NULL, CASE WHEN _ret IS NULL THEN pg_catalog.to_jsonb(OLD) END,
            CASE WHEN _ret IS NOT NULL THEN pg_catalog.jsonb_build_object('retires', _ret) END, OLD.kind, OLD.parent_id, OLD.note);
    RETURN OLD;
END $function$

-- function cow_changes.t2_fkcheck()
CREATE OR REPLACE FUNCTION cow_changes.t2_fkcheck()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text;
    _marks text := current_setting('cow._mark_t2', true);
    _mark bigint;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text := '23503';
    _btab text;
    _bsch text;
    _g text;
BEGIN
    IF coalesce(_marks, '') = '' THEN
        RETURN NULL;
    END IF;
    _mark := split_part(_marks, ',', -1)::bigint;
    _g := set_config('cow._mark_t2', regexp_replace(_marks, ',?[^,]*$', ''), true);
    _s := cow._session();
    IF _s IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is not present in table "%s".', 'parent_id', concat_ws(', ', coalesce(c.parent_id::text, 'null')), 'parent')
    INTO _seq, _det FROM cow_changes.t2 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted IS NOT TRUE AND c.parent_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM cow_overlay_public.parent z WHERE z.id = c.parent_id) AND (c._cow_fk & 1) <> 0
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'events_parent_id_fkey'; _bmsg := 'insert or update on table "events" violates foreign key constraint "events_parent_id_fkey"'; _bcode := '23503'; _btab := NULL; _bsch := NULL;
    END IF;
    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg,
            DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'events'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t2_ins()
CREATE OR REPLACE FUNCTION cow_changes.t2_ins()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _bad text;
    _ret bigint;
    _pfk int;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF _s IS NULL THEN
        INSERT INTO public.events AS y (kind, parent_id, note)  VALUES (NEW.kind, NEW.parent_id, NEW.note) RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
    IF NEW.kind IS NULL THEN
        IF NEW.kind IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "kind" of relation "events" violates not-null constraint', SCHEMA = 'public', TABLE = 'events', COLUMN = 'kind';
        END IF;
    END IF;
    INSERT INTO cow_changes.t2 (_cow_session, _cow_op, _cow_deleted, _cow_fk, kind, parent_id, note) VALUES (_s, _o, false, 0 | CASE WHEN NEW.parent_id IS NOT NULL THEN 1 ELSE 0 END, NEW.kind, NEW.parent_id, NEW.note);
    RETURN NEW;
END $function$

-- function cow_changes.t2_mark()
CREATE OR REPLACE FUNCTION cow_changes.t2_mark()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    _g text;
BEGIN
    _g := set_config('cow._mark_t2', concat_ws(',', nullif(current_setting('cow._mark_t2', true), ''),
        coalesce(pg_catalog.pg_sequence_last_value('cow.write_seq'::pg_catalog.regclass), 0)::text), true);
    RETURN NULL;
END $function$

-- function cow_changes.t2_upd()
CREATE OR REPLACE FUNCTION cow_changes.t2_upd()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _bad text;
    _ret bigint;
    _pfk int;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF _s IS NULL THEN
        UPDATE public.events AS y SET (kind, parent_id, note) = ROW(NEW.kind, NEW.parent_id, NEW.note) WHERE (y.tableoid, y.ctid) = (SELECT _cow_z.tableoid, _cow_z.ctid FROM public.events _cow_z WHERE _cow_z = ROW(OLD.kind, OLD.parent_id, OLD.note)::public.events LIMIT 1) RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
    IF NEW.kind IS NULL THEN
        IF NEW.kind IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "kind" of relation "events" violates not-null constraint', SCHEMA = 'public', TABLE = 'events', COLUMN = 'kind';
        END IF;
    END IF;
    _ret := NULL;
    _pfk := NULL;
    UPDATE cow_changes.t2 x SET _cow_current = false WHERE x._cow_current AND x.ctid = (SELECT y.ctid FROM cow_changes.t2 y
        WHERE y._cow_session = _s AND y._cow_current AND NOT y._cow_deleted AND ROW(y.kind, y.parent_id, y.note)::public.events = ROW(OLD.kind, OLD.parent_id, OLD.note)::public.events AND y.kind = OLD.kind ORDER BY y._cow_seq DESC LIMIT 1)
        RETURNING x._cow_seq, x._cow_fk INTO _ret, _pfk;
    INSERT INTO cow_changes.t2 (_cow_session, _cow_op, _cow_deleted, _cow_current, _cow_base, _cow_origin, kind, parent_id, note)
    VALUES (_s, _o, true, _ret IS NULL, CASE WHEN _ret IS NULL THEN pg_catalog.to_jsonb(OLD) END,
            CASE WHEN _ret IS NOT NULL THEN pg_catalog.jsonb_build_object('retires', _ret) END, OLD.kind, OLD.parent_id, OLD.note);
    INSERT INTO cow_changes.t2 (_cow_session, _cow_op, _cow_deleted, _cow_fk, kind, parent_id, note) VALUES (_s, _o, false, 0 | CASE WHEN (NEW.parent_id IS DISTINCT FROM OLD.parent_id) AND NEW.parent_id IS NOT NULL THEN 1 ELSE 0 END, NEW.kind, NEW.parent_id, NEW.note);
    RETURN NEW;
END $function$

-- function cow_changes.t3_del()
CREATE OR REPLACE FUNCTION cow_changes.t3_del()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _base jsonb;
    _seen boolean;
    _bad text;
    _pfk int;
    _pseq bigint;
    _porig jsonb;
    _morig jsonb;
    _pdel boolean;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF _s IS NULL THEN
        DELETE FROM public.parent AS y WHERE y.id = OLD.id;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        RETURN OLD;
    END IF;
    _o := cow._write_operation();
    IF pg_catalog.pg_sequence_last_value('cow.row_locks'::pg_catalog.regclass) IS NOT NULL THEN
    DECLARE
        _lh int8 := cow._row_lock_hash(_s, 't3', pg_catalog.jsonb_build_array(OLD.id), 1);
    BEGIN
        PERFORM pg_catalog.pg_advisory_lock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);
        PERFORM pg_catalog.pg_advisory_unlock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);
    END;
    END IF;
    IF EXISTS (SELECT 1 FROM cow_overlay_public.child z WHERE z.kept_id = OLD.id) THEN
        RAISE EXCEPTION USING ERRCODE = '23001', MESSAGE = 'update or delete on table "parent" violates foreign key constraint "child_kept_id_fkey" on table "child"', DETAIL = format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(OLD.id::text, 'null')), 'child'), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_kept_id_fkey';
    END IF;

    _seen := NULL;
    UPDATE cow_changes.t3 x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND x.id = OLD.id AND ((NOT x._cow_deleted AND x.id IS NOT DISTINCT FROM OLD.id AND x.code IS NOT DISTINCT FROM OLD.code AND x.name IS NOT DISTINCT FROM OLD.name AND x.span IS NOT DISTINCT FROM OLD.span) OR pg_catalog.pg_xact_status(cow._xid8(x.xmin)) IS DISTINCT FROM 'committed')
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    IF _seen IS NULL THEN
        _base := pg_catalog.to_jsonb(OLD);
    END IF;
    INSERT INTO cow_changes.t3 (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, id, code, name, span)
    VALUES (_s, _o, true, _base, 0, CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object('id', OLD.id) ELSE _porig END, OLD.id, OLD.code, OLD.name, OLD.span)
    ON CONFLICT (_cow_session, id) WHERE _cow_current DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'could not serialize access due to concurrent update', DETAIL = format('Another transaction of session %s changed the row of "parent" with key (id)=(%s) after this statement read it.', _s, concat_ws(', ', coalesce(OLD.id::text, 'null'))), HINT = cow._row_changed_hint(), SCHEMA = 'public', TABLE = 'parent';
    END IF;
    UPDATE cow_overlay_public.child z SET fallback_id = DEFAULT WHERE z.fallback_id = OLD.id;
    IF EXISTS (SELECT 1 FROM cow_overlay_public.child z WHERE z.fallback_id = OLD.id) THEN
        RAISE EXCEPTION USING ERRCODE = '23503', MESSAGE = 'update or delete on table "parent" violates foreign key constraint "child_fallback_id_fkey" on table "child"', DETAIL = format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(OLD.id::text, 'null')), 'child'), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_fallback_id_fkey';
    END IF;
    UPDATE cow_overlay_public.child z SET parent_code = NULL WHERE z.parent_code = OLD.code;
    DELETE FROM cow_overlay_public.child z WHERE z.parent_id = OLD.id;
    DELETE FROM cow_overlay_public.events z WHERE z.parent_id = OLD.id;
    RETURN OLD;
END $function$

-- function cow_changes.t3_dfr1()
CREATE OR REPLACE FUNCTION cow_changes.t3_dfr1()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := NEW._cow_session;
    _v bigint := NEW._cow_seq;
    _k int;
    _i int;
    _g text;
    _g0 text;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text;
    _btab text;
    _bsch text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF pg_catalog.pg_trigger_depth() > 1 THEN
        -- IMMEDIATE mode, inside a write: the statement trigger checks at the end of the statement.
        _g := coalesce(pg_catalog.current_setting('cow._dq_t3', true), '');
        FOR _i IN 0 .. TG_NARGS - 1 LOOP
            IF pg_catalog.strpos(_g, ',' || TG_ARGV[_i] || ',') = 0 THEN
                _g := CASE WHEN _g = '' THEN ',' ELSE _g END || TG_ARGV[_i] || ',';
                _g := pg_catalog.set_config('cow._dq_t3', _g, true);
            END IF;
        END LOOP;
        RETURN NULL;
    END IF;
    -- At COMMIT or SET CONSTRAINTS: the checks read the session that wrote the version.
    _g0 := pg_catalog.current_setting('cow.session_id', true);
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', _s, true);  -- (_g: the flags above, unused from here)
    END IF;
    FOR _i IN 0 .. TG_NARGS - 1 LOOP
        _k := TG_ARGV[_i]::int;
    IF _k = 1 THEN
    _seq := NULL;
    FOR _r IN SELECT * FROM cow_changes.t3 c WHERE c._cow_session = _s AND c.id = NEW.id AND c._cow_seq = _v AND c._cow_current AND c._cow_deleted IS NOT TRUE ORDER BY c._cow_seq LOOP
        SELECT true AS p, (span) AS k1 INTO _cow_k FROM (SELECT _r.id AS id, _r.code AS code, _r.name AS name, _r.span AS span) AS _x;
        IF _cow_k.p IS TRUE AND _cow_k.k1 IS NOT NULL THEN
            SELECT _y.d INTO _cow_c FROM (SELECT concat_ws(', ', coalesce(((span))::text, 'null')) AS d FROM public.parent b WHERE (span) OPERATOR(pg_catalog.&&) _cow_k.k1 AND NOT (b.id = _r.id)
                AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_current AND c.id = b.id OFFSET 0)
                UNION ALL SELECT concat_ws(', ', coalesce(((span))::text, 'null')) AS d FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_current AND NOT c._cow_deleted
                AND (span) OPERATOR(pg_catalog.&&) _cow_k.k1 AND NOT (c.id = _r.id)) AS _y LIMIT 1;
            IF FOUND THEN
                _seq := _r._cow_seq;
                _det := format('Key (%s)=(%s) conflicts with existing key (%s)=(%s).', 'span', concat_ws(', ', coalesce(_cow_k.k1::text, 'null')), 'span', _cow_c.d);
                EXIT;
            END IF;
        END IF;
    END LOOP;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'parent_span_excl'; _bmsg := 'conflicting key value violates exclusion constraint "parent_span_excl"'; _bcode := '23P01'; _btab := NULL; _bsch := NULL;
    END IF;
    END IF;
    END LOOP;
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', coalesce(_g0, ''), true);
    END IF;
    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg, DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'parent'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t3_dfr2()
CREATE OR REPLACE FUNCTION cow_changes.t3_dfr2()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := NEW._cow_session;
    _v bigint := NEW._cow_seq;
    _k int;
    _i int;
    _g text;
    _g0 text;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text;
    _btab text;
    _bsch text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF pg_catalog.pg_trigger_depth() > 1 THEN
        -- IMMEDIATE mode, inside a write: the statement trigger checks at the end of the statement.
        _g := coalesce(pg_catalog.current_setting('cow._dq_t3', true), '');
        FOR _i IN 0 .. TG_NARGS - 1 LOOP
            IF pg_catalog.strpos(_g, ',' || TG_ARGV[_i] || ',') = 0 THEN
                _g := CASE WHEN _g = '' THEN ',' ELSE _g END || TG_ARGV[_i] || ',';
                _g := pg_catalog.set_config('cow._dq_t3', _g, true);
            END IF;
        END LOOP;
        RETURN NULL;
    END IF;
    -- At COMMIT or SET CONSTRAINTS: the checks read the session that wrote the version.
    _g0 := pg_catalog.current_setting('cow.session_id', true);
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', _s, true);  -- (_g: the flags above, unused from here)
    END IF;
    FOR _i IN 0 .. TG_NARGS - 1 LOOP
        _k := TG_ARGV[_i]::int;
    IF _k = 2 THEN
    IF NEW._cow_deleted AND NEW.id IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM cow_changes.t3 c WHERE c._cow_session = _s AND c.id = NEW.id AND c._cow_seq = _v AND c._cow_current) THEN
            IF (EXISTS (SELECT 1 FROM cow_changes.t1 z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND z.later_id = NEW.id OFFSET 0) OR EXISTS (SELECT 1 FROM public.child z WHERE z.later_id = NEW.id AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 y WHERE y._cow_session = _s AND y._cow_current AND y.id = z.id OFFSET 0) OFFSET 0)) THEN
                IF NOT (EXISTS (SELECT 1 FROM cow_changes.t3 z WHERE z._cow_session = _s AND z._cow_current AND z._cow_deleted IS NOT TRUE AND z.id = NEW.id OFFSET 0) OR EXISTS (SELECT 1 FROM public.parent z WHERE z.id = NEW.id AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 y WHERE y._cow_session = _s AND y._cow_current AND y.id = z.id OFFSET 0) OFFSET 0)) THEN
                    _seq := _v;
                    _det := format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(NEW.id::text, 'null')), 'child');
                    IF _best IS NULL OR _seq < _best THEN
                        _best := _seq; _bdet := _det; _bcon := 'child_later_id_fkey'; _bmsg := 'update or delete on table "parent" violates foreign key constraint "child_later_id_fkey" on table "child"'; _bcode := '23503'; _btab := 'child'; _bsch := 'public';
                    END IF;
                END IF;
            END IF;
        END IF;
    END IF;
    END IF;
    END LOOP;
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', coalesce(_g0, ''), true);
    END IF;
    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg, DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'parent'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t3_fkcheck()
CREATE OR REPLACE FUNCTION cow_changes.t3_fkcheck()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text;
    _marks text := current_setting('cow._mark_t3', true);
    _mark bigint;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text := '23503';
    _btab text;
    _bsch text;
    _g text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF coalesce(_marks, '') = '' THEN
        RETURN NULL;
    END IF;
    _mark := split_part(_marks, ',', -1)::bigint;
    _g := set_config('cow._mark_t3', regexp_replace(_marks, ',?[^,]*$', ''), true);
    _s := cow._session();
    IF _s IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(c.id::text, 'null')), 'child')
    INTO _seq, _det FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted AND c.id IS NOT NULL
        AND CASE WHEN EXISTS (SELECT 1 FROM cow_overlay_public.child k WHERE k.kept_id = c.id) THEN NOT EXISTS (SELECT 1 FROM cow_overlay_public.parent z WHERE z.id = c.id) ELSE false END
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_kept_id_fkey'; _bmsg := 'update or delete on table "parent" violates foreign key constraint "child_kept_id_fkey" on table "child"'; _bcode := '23503'; _btab := 'child'; _bsch := 'public';
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is still referenced from table "%s".', 'code', concat_ws(', ', coalesce(c.code::text, 'null')), 'child')
    INTO _seq, _det FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted AND c.code IS NOT NULL
        AND CASE WHEN EXISTS (SELECT 1 FROM cow_overlay_public.child k WHERE k.parent_code = c.code) THEN NOT EXISTS (SELECT 1 FROM cow_overlay_public.parent z WHERE z.code = c.code) ELSE false END
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_parent_code_fkey'; _bmsg := 'update or delete on table "parent" violates foreign key constraint "child_parent_code_fkey" on table "child"'; _bcode := '23503'; _btab := 'child'; _bsch := 'public';
    END IF;
    SELECT c._cow_seq, format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(c.id::text, 'null')), 'events')
    INTO _seq, _det FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted AND c.id IS NOT NULL
        AND CASE WHEN EXISTS (SELECT 1 FROM cow_overlay_public.events k WHERE k.parent_id = c.id) THEN NOT EXISTS (SELECT 1 FROM cow_overlay_public.parent z WHERE z.id = c.id) ELSE false END
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'events_parent_id_fkey'; _bmsg := 'update or delete on table "parent" violates foreign key constraint "events_parent_id_fkey" on table "events"'; _bcode := '23503'; _btab := 'events'; _bsch := 'public';
    END IF;
    IF coalesce(pg_catalog.current_setting('cow._dq_t3', true), '') <> '' THEN
        _g := cow_changes.t3_fkdq(_marks, _mark, _best);
    END IF;
    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg,
            DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'parent'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t3_fkdq(text,bigint,bigint)
CREATE OR REPLACE FUNCTION cow_changes.t3_fkdq(_marks text, _mark bigint, _best bigint)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    _g text := pg_catalog.current_setting('cow._dq_t3', true);
    _s text;
    _seq bigint;
    _det text;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text;
    _btab text;
    _bsch text;
    _cfg text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF regexp_replace(_marks, ',?[^,]*$', '') = '' THEN
        _cfg := pg_catalog.set_config('cow._dq_t3', '', true);
    END IF;
    _s := cow._session();
    IF pg_catalog.strpos(_g, ',1,') > 0 THEN
    _seq := NULL;
    FOR _r IN SELECT * FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_seq > _mark AND c._cow_current AND c._cow_deleted IS NOT TRUE ORDER BY c._cow_seq LOOP
        SELECT true AS p, (span) AS k1 INTO _cow_k FROM (SELECT _r.id AS id, _r.code AS code, _r.name AS name, _r.span AS span) AS _x;
        IF _cow_k.p IS TRUE AND _cow_k.k1 IS NOT NULL THEN
            SELECT _y.d INTO _cow_c FROM (SELECT concat_ws(', ', coalesce(((span))::text, 'null')) AS d FROM public.parent b WHERE (span) OPERATOR(pg_catalog.&&) _cow_k.k1 AND NOT (b.id = _r.id)
                AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_current AND c.id = b.id OFFSET 0)
                UNION ALL SELECT concat_ws(', ', coalesce(((span))::text, 'null')) AS d FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_current AND NOT c._cow_deleted
                AND (span) OPERATOR(pg_catalog.&&) _cow_k.k1 AND NOT (c.id = _r.id)) AS _y LIMIT 1;
            IF FOUND THEN
                _seq := _r._cow_seq;
                _det := format('Key (%s)=(%s) conflicts with existing key (%s)=(%s).', 'span', concat_ws(', ', coalesce(_cow_k.k1::text, 'null')), 'span', _cow_c.d);
                EXIT;
            END IF;
        END IF;
    END LOOP;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'parent_span_excl'; _bmsg := 'conflicting key value violates exclusion constraint "parent_span_excl"'; _bcode := '23P01'; _btab := NULL; _bsch := NULL;
    END IF;
    END IF;
    IF pg_catalog.strpos(_g, ',2,') > 0 THEN
    SELECT c._cow_seq, format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(c.id::text, 'null')), 'child')
    INTO _seq, _det FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_seq > _mark
        AND c._cow_current AND c._cow_deleted AND c.id IS NOT NULL
        AND CASE WHEN (EXISTS (SELECT 1 FROM cow_changes.t1 z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND z.later_id = c.id OFFSET 0) OR EXISTS (SELECT 1 FROM public.child z WHERE z.later_id = c.id AND NOT EXISTS (SELECT 1 FROM cow_changes.t1 y WHERE y._cow_session = _s AND y._cow_current AND y.id = z.id OFFSET 0) OFFSET 0)) THEN NOT (EXISTS (SELECT 1 FROM cow_changes.t3 z WHERE z._cow_session = _s AND z._cow_current AND z._cow_deleted IS NOT TRUE AND z.id = c.id OFFSET 0) OR EXISTS (SELECT 1 FROM public.parent z WHERE z.id = c.id AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 y WHERE y._cow_session = _s AND y._cow_current AND y.id = z.id OFFSET 0) OFFSET 0)) ELSE false END
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := 'child_later_id_fkey'; _bmsg := 'update or delete on table "parent" violates foreign key constraint "child_later_id_fkey" on table "child"'; _bcode := '23503'; _btab := 'child'; _bsch := 'public';
    END IF;
    END IF;
    IF _bmsg IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg,
            DETAIL = _bdet, SCHEMA = coalesce(_bsch, 'public'), TABLE = coalesce(_btab, 'parent'), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $function$

-- function cow_changes.t3_ins()
CREATE OR REPLACE FUNCTION cow_changes.t3_ins()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _base jsonb;
    _seen boolean;
    _bad text;
    _pfk int;
    _pseq bigint;
    _porig jsonb;
    _morig jsonb;
    _pdel boolean;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF _s IS NULL THEN
        INSERT INTO public.parent AS y (id, code, name, span)  VALUES (NEW.id, NEW.code, NEW.name, NEW.span) RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
    IF NEW.id IS NULL OR NEW.code IS NULL THEN
        IF NEW.id IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "id" of relation "parent" violates not-null constraint', SCHEMA = 'public', TABLE = 'parent', COLUMN = 'id';
        END IF;
        IF NEW.code IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "code" of relation "parent" violates not-null constraint', SCHEMA = 'public', TABLE = 'parent', COLUMN = 'code';
        END IF;
    END IF;
    SELECT CASE WHEN ((name <> ''::text)) IS FALSE THEN 'parent_name_check' END INTO _bad FROM (SELECT NEW.id AS id, NEW.code AS code, NEW.name AS name, NEW.span AS span) AS _x;
    IF _bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '23514', MESSAGE = format('new row for relation "%s" violates check constraint "%s"', 'parent', _bad), SCHEMA = 'public', TABLE = 'parent', CONSTRAINT = _bad;
    END IF;
    SELECT c._cow_deleted INTO _pdel FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_current AND c.id = NEW.id;
    IF _pdel IS FALSE OR (_pdel IS NULL AND EXISTS (SELECT 1 FROM public.parent z WHERE z.id = NEW.id)) THEN
        RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "parent_pkey"', DETAIL = format('Key (%s)=(%s) already exists.', 'id', concat_ws(', ', coalesce(NEW.id::text, 'null'))), SCHEMA = 'public', TABLE = 'parent', CONSTRAINT = 'parent_pkey';
    END IF;
    IF (EXISTS (SELECT 1 FROM cow_changes.t3 z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND z.code IS NOT DISTINCT FROM NEW.code OFFSET 0) OR EXISTS (SELECT 1 FROM public.parent z WHERE z.code IS NOT DISTINCT FROM NEW.code AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_current AND c.id = z.id OFFSET 0) OFFSET 0)) THEN
        RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "parent_code_key"', DETAIL = format('Key (%s)=(%s) already exists.', 'code', concat_ws(', ', coalesce(NEW.code::text, 'null'))), SCHEMA = 'public', TABLE = 'parent', CONSTRAINT = 'parent_code_key';
    END IF;
    IF _pdel IS NOT NULL THEN

    _seen := NULL;
    UPDATE cow_changes.t3 x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND x.id = NEW.id
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    END IF;
    INSERT INTO cow_changes.t3 (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, id, code, name, span)
    VALUES (_s, _o, false, _base, 0, NULL, NEW.id, NEW.code, NEW.name, NEW.span);
    RETURN NEW;
END $function$

-- function cow_changes.t3_mark()
CREATE OR REPLACE FUNCTION cow_changes.t3_mark()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    _g text;
BEGIN
    _g := set_config('cow._mark_t3', concat_ws(',', nullif(current_setting('cow._mark_t3', true), ''),
        coalesce(pg_catalog.pg_sequence_last_value('cow.write_seq'::pg_catalog.regclass), 0)::text), true);
    RETURN NULL;
END $function$

-- function cow_changes.t3_upd()
CREATE OR REPLACE FUNCTION cow_changes.t3_upd()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    _s text := cow._session();
    _o text;
    _g text;
    _base jsonb;
    _seen boolean;
    _bad text;
    _pfk int;
    _pseq bigint;
    _porig jsonb;
    _morig jsonb;
    _pdel boolean;
BEGIN
    IF _s IS NOT NULL AND pg_catalog.current_setting('cow._open', true) IS DISTINCT FROM cow._open_stamp(_s) THEN
        _g := cow._write_session();
    END IF;
    IF _s IS NULL THEN
        UPDATE public.parent AS y SET (id, code, name, span) = ROW(NEW.id, NEW.code, NEW.name, NEW.span) WHERE y.id = OLD.id RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
    IF pg_catalog.pg_sequence_last_value('cow.row_locks'::pg_catalog.regclass) IS NOT NULL THEN
    DECLARE
        _lh int8 := cow._row_lock_hash(_s, 't3', pg_catalog.jsonb_build_array(OLD.id), CASE WHEN (NEW.id IS DISTINCT FROM OLD.id) THEN 1 ELSE 2 END);
    BEGIN
        PERFORM pg_catalog.pg_advisory_lock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);
        PERFORM pg_catalog.pg_advisory_unlock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);
    END;
    END IF;
    IF NEW.id IS NULL OR NEW.code IS NULL THEN
        IF NEW.id IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "id" of relation "parent" violates not-null constraint', SCHEMA = 'public', TABLE = 'parent', COLUMN = 'id';
        END IF;
        IF NEW.code IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23502', MESSAGE = 'null value in column "code" of relation "parent" violates not-null constraint', SCHEMA = 'public', TABLE = 'parent', COLUMN = 'code';
        END IF;
    END IF;
    SELECT CASE WHEN ((name <> ''::text)) IS FALSE THEN 'parent_name_check' END INTO _bad FROM (SELECT NEW.id AS id, NEW.code AS code, NEW.name AS name, NEW.span AS span) AS _x;
    IF _bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '23514', MESSAGE = format('new row for relation "%s" violates check constraint "%s"', 'parent', _bad), SCHEMA = 'public', TABLE = 'parent', CONSTRAINT = _bad;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) THEN
        IF NEW.id IS NOT NULL AND (EXISTS (SELECT 1 FROM cow_changes.t3 z WHERE z._cow_session = _s AND z._cow_current AND z._cow_deleted IS NOT TRUE AND z.id = NEW.id AND NOT (z.id = OLD.id) OFFSET 0) OR EXISTS (SELECT 1 FROM public.parent z WHERE z.id = NEW.id AND NOT (z.id = OLD.id) AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_current AND c.id = z.id OFFSET 0) OFFSET 0)) THEN
            RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "parent_pkey"', DETAIL = format('Key (%s)=(%s) already exists.', 'id', concat_ws(', ', coalesce(NEW.id::text, 'null'))), SCHEMA = 'public', TABLE = 'parent', CONSTRAINT = 'parent_pkey';
        END IF;
    END IF;
    IF (NEW.code IS DISTINCT FROM OLD.code) THEN
        IF (EXISTS (SELECT 1 FROM cow_changes.t3 z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND z.code IS NOT DISTINCT FROM NEW.code AND NOT (z.id = OLD.id) OFFSET 0) OR EXISTS (SELECT 1 FROM public.parent z WHERE z.code IS NOT DISTINCT FROM NEW.code AND NOT (z.id = OLD.id) AND NOT EXISTS (SELECT 1 FROM cow_changes.t3 c WHERE c._cow_session = _s AND c._cow_current AND c.id = z.id OFFSET 0) OFFSET 0)) THEN
            RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "parent_code_key"', DETAIL = format('Key (%s)=(%s) already exists.', 'code', concat_ws(', ', coalesce(NEW.code::text, 'null'))), SCHEMA = 'public', TABLE = 'parent', CONSTRAINT = 'parent_code_key';
        END IF;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) AND NOT (NEW.id IS DISTINCT FROM OLD.id) THEN
        IF EXISTS (SELECT 1 FROM cow_overlay_public.child z WHERE z.kept_id = OLD.id) THEN
            RAISE EXCEPTION USING ERRCODE = '23503', MESSAGE = 'update or delete on table "parent" violates foreign key constraint "child_kept_id_fkey" on table "child"', DETAIL = format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(OLD.id::text, 'null')), 'child'), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_kept_id_fkey';
        END IF;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) AND NOT (NEW.id IS DISTINCT FROM OLD.id) THEN
        IF EXISTS (SELECT 1 FROM cow_overlay_public.child z WHERE z.later_id = OLD.id) THEN
            RAISE EXCEPTION USING ERRCODE = '23503', MESSAGE = 'update or delete on table "parent" violates foreign key constraint "child_later_id_fkey" on table "child"', DETAIL = format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(OLD.id::text, 'null')), 'child'), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_later_id_fkey';
        END IF;
    END IF;
    IF (NEW.code IS DISTINCT FROM OLD.code) AND NOT (NEW.id IS DISTINCT FROM OLD.id) THEN
        IF EXISTS (SELECT 1 FROM cow_overlay_public.child z WHERE z.parent_code = OLD.code) THEN
            RAISE EXCEPTION USING ERRCODE = '23503', MESSAGE = 'update or delete on table "parent" violates foreign key constraint "child_parent_code_fkey" on table "child"', DETAIL = format('Key (%s)=(%s) is still referenced from table "%s".', 'code', concat_ws(', ', coalesce(OLD.code::text, 'null')), 'child'), SCHEMA = 'public', TABLE = 'child', CONSTRAINT = 'child_parent_code_fkey';
        END IF;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) AND NOT (NEW.id IS DISTINCT FROM OLD.id) THEN
        IF EXISTS (SELECT 1 FROM cow_overlay_public.events z WHERE z.parent_id = OLD.id) THEN
            RAISE EXCEPTION USING ERRCODE = '23503', MESSAGE = 'update or delete on table "parent" violates foreign key constraint "events_parent_id_fkey" on table "events"', DETAIL = format('Key (%s)=(%s) is still referenced from table "%s".', 'id', concat_ws(', ', coalesce(OLD.id::text, 'null')), 'events'), SCHEMA = 'public', TABLE = 'events', CONSTRAINT = 'events_parent_id_fkey';
        END IF;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) THEN

    _seen := NULL;
    UPDATE cow_changes.t3 x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND x.id = OLD.id AND ((NOT x._cow_deleted AND x.id IS NOT DISTINCT FROM OLD.id AND x.code IS NOT DISTINCT FROM OLD.code AND x.name IS NOT DISTINCT FROM OLD.name AND x.span IS NOT DISTINCT FROM OLD.span) OR pg_catalog.pg_xact_status(cow._xid8(x.xmin)) IS DISTINCT FROM 'committed')
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    IF _seen IS NULL THEN
        _base := pg_catalog.to_jsonb(OLD);
    END IF;
    INSERT INTO cow_changes.t3 (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, id, code, name, span)
    VALUES (_s, _o, true, _base, 0, CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object('id', OLD.id) ELSE _porig END, OLD.id, OLD.code, OLD.name, OLD.span)
    ON CONFLICT (_cow_session, id) WHERE _cow_current DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'could not serialize access due to concurrent update', DETAIL = format('Another transaction of session %s changed the row of "parent" with key (id)=(%s) after this statement read it.', _s, concat_ws(', ', coalesce(OLD.id::text, 'null'))), HINT = cow._row_changed_hint(), SCHEMA = 'public', TABLE = 'parent';
    END IF;
    _morig := CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object('id', OLD.id) ELSE _porig END;
    END IF;

    _seen := NULL;
    UPDATE cow_changes.t3 x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND x.id = NEW.id AND ((NEW.id IS DISTINCT FROM OLD.id) OR ((NOT x._cow_deleted AND x.id IS NOT DISTINCT FROM OLD.id AND x.code IS NOT DISTINCT FROM OLD.code AND x.name IS NOT DISTINCT FROM OLD.name AND x.span IS NOT DISTINCT FROM OLD.span) OR pg_catalog.pg_xact_status(cow._xid8(x.xmin)) IS DISTINCT FROM 'committed'))
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    IF _seen IS NULL THEN
        IF NOT (NEW.id IS DISTINCT FROM OLD.id) THEN
            _base := pg_catalog.to_jsonb(OLD);
        ELSE
            _base := (SELECT pg_catalog.to_jsonb(y.*) FROM public.parent y WHERE y.id = NEW.id);
        END IF;
    END IF;
    INSERT INTO cow_changes.t3 (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, id, code, name, span)
    VALUES (_s, _o, false, _base, 0, CASE WHEN (NEW.id IS DISTINCT FROM OLD.id) THEN _morig WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object('id', NEW.id) ELSE _porig END, NEW.id, NEW.code, NEW.name, NEW.span)
    ON CONFLICT (_cow_session, id) WHERE _cow_current DO NOTHING;
    IF NOT FOUND THEN
        IF (NEW.id IS DISTINCT FROM OLD.id) THEN
            RAISE EXCEPTION USING ERRCODE = '23505', MESSAGE = 'duplicate key value violates unique constraint "parent_pkey"', DETAIL = format('Key (%s)=(%s) already exists.', 'id', concat_ws(', ', coalesce(NEW.id::text, 'null'))), SCHEMA = 'public', TABLE = 'parent', CONSTRAINT = 'parent_pkey';
        ELSE
            RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'could not serialize access due to concurrent update', DETAIL = format('Another transaction of session %s changed the row of "parent" with key (id)=(%s) after this statement read it.', _s, concat_ws(', ', coalesce(OLD.id::text, 'null'))), HINT = cow._row_changed_hint(), SCHEMA = 'public', TABLE = 'parent';
        END IF;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) THEN
        UPDATE cow_overlay_public.child z SET fallback_id = NULL WHERE z.fallback_id = OLD.id;
    END IF;
    IF (NEW.id IS DISTINCT FROM OLD.id) THEN
        UPDATE cow_overlay_public.child z SET parent_id = NEW.id WHERE z.parent_id = OLD.id;
    END IF;
    RETURN NEW;
END $function$

-- trigger cow_changes.t1 child_later_id_fkey
CREATE CONSTRAINT TRIGGER child_later_id_fkey AFTER INSERT ON cow_changes.t1 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new._cow_fk & 4) <> 0)) EXECUTE FUNCTION cow_changes.t1_dfr2('2')

-- trigger cow_changes.t1 child_slot_key
CREATE CONSTRAINT TRIGGER child_slot_key AFTER INSERT ON cow_changes.t1 DEFERRABLE INITIALLY IMMEDIATE FOR EACH ROW WHEN ((NOT new._cow_deleted)) EXECUTE FUNCTION cow_changes.t1_dfr1('1')

-- trigger cow_changes.t3 child_later_id_fkey
CREATE CONSTRAINT TRIGGER child_later_id_fkey AFTER INSERT ON cow_changes.t3 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (new._cow_deleted) EXECUTE FUNCTION cow_changes.t3_dfr2('2')

-- trigger cow_changes.t3 parent_span_excl
CREATE CONSTRAINT TRIGGER parent_span_excl AFTER INSERT ON cow_changes.t3 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((NOT new._cow_deleted)) EXECUTE FUNCTION cow_changes.t3_dfr1('1')

-- trigger cow_overlay_public.child cow_delete
CREATE TRIGGER cow_delete INSTEAD OF DELETE ON cow_overlay_public.child FOR EACH ROW EXECUTE FUNCTION cow_changes.t1_del()

-- trigger cow_overlay_public.child cow_fk_check
CREATE TRIGGER cow_fk_check AFTER INSERT OR DELETE OR UPDATE ON cow_overlay_public.child FOR EACH STATEMENT EXECUTE FUNCTION cow_changes.t1_fkcheck()

-- trigger cow_overlay_public.child cow_fk_mark
CREATE TRIGGER cow_fk_mark BEFORE INSERT OR DELETE OR UPDATE ON cow_overlay_public.child FOR EACH STATEMENT EXECUTE FUNCTION cow_changes.t1_mark()

-- trigger cow_overlay_public.child cow_insert
CREATE TRIGGER cow_insert INSTEAD OF INSERT ON cow_overlay_public.child FOR EACH ROW EXECUTE FUNCTION cow_changes.t1_ins()

-- trigger cow_overlay_public.child cow_update
CREATE TRIGGER cow_update INSTEAD OF UPDATE ON cow_overlay_public.child FOR EACH ROW EXECUTE FUNCTION cow_changes.t1_upd()

-- trigger cow_overlay_public.events cow_delete
CREATE TRIGGER cow_delete INSTEAD OF DELETE ON cow_overlay_public.events FOR EACH ROW EXECUTE FUNCTION cow_changes.t2_del()

-- trigger cow_overlay_public.events cow_fk_check
CREATE TRIGGER cow_fk_check AFTER INSERT OR DELETE OR UPDATE ON cow_overlay_public.events FOR EACH STATEMENT EXECUTE FUNCTION cow_changes.t2_fkcheck()

-- trigger cow_overlay_public.events cow_fk_mark
CREATE TRIGGER cow_fk_mark BEFORE INSERT OR DELETE OR UPDATE ON cow_overlay_public.events FOR EACH STATEMENT EXECUTE FUNCTION cow_changes.t2_mark()

-- trigger cow_overlay_public.events cow_insert
CREATE TRIGGER cow_insert INSTEAD OF INSERT ON cow_overlay_public.events FOR EACH ROW EXECUTE FUNCTION cow_changes.t2_ins()

-- trigger cow_overlay_public.events cow_update
CREATE TRIGGER cow_update INSTEAD OF UPDATE ON cow_overlay_public.events FOR EACH ROW EXECUTE FUNCTION cow_changes.t2_upd()

-- trigger cow_overlay_public.parent cow_delete
CREATE TRIGGER cow_delete INSTEAD OF DELETE ON cow_overlay_public.parent FOR EACH ROW EXECUTE FUNCTION cow_changes.t3_del()

-- trigger cow_overlay_public.parent cow_fk_check
CREATE TRIGGER cow_fk_check AFTER INSERT OR DELETE OR UPDATE ON cow_overlay_public.parent FOR EACH STATEMENT EXECUTE FUNCTION cow_changes.t3_fkcheck()

-- trigger cow_overlay_public.parent cow_fk_mark
CREATE TRIGGER cow_fk_mark BEFORE INSERT OR DELETE OR UPDATE ON cow_overlay_public.parent FOR EACH STATEMENT EXECUTE FUNCTION cow_changes.t3_mark()

-- trigger cow_overlay_public.parent cow_insert
CREATE TRIGGER cow_insert INSTEAD OF INSERT ON cow_overlay_public.parent FOR EACH ROW EXECUTE FUNCTION cow_changes.t3_ins()

-- trigger cow_overlay_public.parent cow_update
CREATE TRIGGER cow_update INSTEAD OF UPDATE ON cow_overlay_public.parent FOR EACH ROW EXECUTE FUNCTION cow_changes.t3_upd()

-- view cow_overlay_public.child
SELECT id,
    parent_id,
    parent_code,
    kept_id,
    later_id,
    up,
    fallback_id,
    qty,
    twice,
    slot,
    during
   FROM ( SELECT 1 AS _cow_k,
            b.id,
            b.parent_id,
            b.parent_code,
            b.kept_id,
            b.later_id,
            b.up,
            b.fallback_id,
            b.qty,
            b.twice,
            b.slot,
            b.during,
            COALESCE(current_setting('cow.session_id'::text, true), ''::text) AS _cow_s,
            NULL::boolean AS _cow_cur,
            NULL::boolean AS _cow_del,
            true AS _cow_b
           FROM child b
        UNION ALL
         SELECT 2,
            c.id,
            c.parent_id,
            c.parent_code,
            c.kept_id,
            c.later_id,
            c.up,
            c.fallback_id,
            c.qty,
            c.twice,
            c.slot,
            c.during,
            c._cow_session,
            c._cow_current,
            c._cow_deleted,
            NULL::boolean
           FROM cow_changes.t1 c) u
  WHERE (((NOT (EXISTS ( SELECT
           FROM cow.my_binding_elsewhere))) OR cow._read_gate()) AND (_cow_s = COALESCE(current_setting('cow.session_id'::text, true), ''::text)) AND
        CASE _cow_k
            WHEN 1 THEN true
            ELSE ((current_setting('cow.session_id'::text, true) <> ''::text) AND _cow_cur AND (NOT _cow_del))
        END AND (NOT (EXISTS ( SELECT 1
           FROM cow_changes.t1 x
          WHERE ((x._cow_session = current_setting('cow.session_id'::text, true)) AND x._cow_current AND ((x.id IS NOT NULL) = u._cow_b) AND (x.id = u.id))))));

-- view cow_overlay_public.events
SELECT _cow_b.kind,
    _cow_b.parent_id,
    _cow_b.note
   FROM events _cow_b
  WHERE (( SELECT (NOT (EXISTS ( SELECT 1
                   FROM cow_changes.t2 x
                  WHERE (((NOT (EXISTS ( SELECT
                           FROM cow.my_binding_elsewhere))) OR cow._read_gate()) AND (x._cow_session = current_setting('cow.session_id'::text, true)) AND x._cow_current AND x._cow_deleted))))) OR (NOT (_cow_b.* IN ( SELECT ROW(x.kind, x.parent_id, x.note)::events AS "row"
           FROM cow_changes.t2 x
          WHERE (((NOT (EXISTS ( SELECT
                   FROM cow.my_binding_elsewhere))) OR cow._read_gate()) AND (x._cow_session = current_setting('cow.session_id'::text, true)) AND x._cow_current AND x._cow_deleted)))))
UNION ALL
 SELECT (k._cow_v).kind AS kind,
    (k._cow_v).parent_id AS parent_id,
    (k._cow_v).note AS note
   FROM (( SELECT t._cow_v,
            t._cow_n,
            count(*) AS _cow_have
           FROM (( SELECT ROW(x.kind, x.parent_id, x.note)::events AS _cow_v,
                    count(*) AS _cow_n
                   FROM cow_changes.t2 x
                  WHERE (((NOT (EXISTS ( SELECT
                           FROM cow.my_binding_elsewhere))) OR cow._read_gate()) AND (x._cow_session = current_setting('cow.session_id'::text, true)) AND x._cow_current AND x._cow_deleted)
                  GROUP BY ROW(x.kind, x.parent_id, x.note)::events) t
             JOIN events _cow_b ON (((_cow_b.* = t._cow_v) AND (_cow_b.kind = (t._cow_v).kind))))
          GROUP BY t._cow_v, t._cow_n) k
     CROSS JOIN LATERAL generate_series((1)::bigint, (k._cow_have - k._cow_n)) generate_series(generate_series))
UNION ALL
 SELECT c.kind,
    c.parent_id,
    c.note
   FROM cow_changes.t2 c
  WHERE (((NOT (EXISTS ( SELECT
           FROM cow.my_binding_elsewhere))) OR cow._read_gate()) AND (c._cow_session = current_setting('cow.session_id'::text, true)) AND c._cow_current AND (NOT c._cow_deleted));

-- view cow_overlay_public.parent
SELECT id,
    code,
    name,
    span
   FROM ( SELECT 1 AS _cow_k,
            b.id,
            b.code,
            b.name,
            b.span,
            COALESCE(current_setting('cow.session_id'::text, true), ''::text) AS _cow_s,
            NULL::boolean AS _cow_cur,
            NULL::boolean AS _cow_del,
            true AS _cow_b
           FROM parent b
        UNION ALL
         SELECT 2,
            c.id,
            c.code,
            c.name,
            c.span,
            c._cow_session,
            c._cow_current,
            c._cow_deleted,
            NULL::boolean
           FROM cow_changes.t3 c) u
  WHERE (((NOT (EXISTS ( SELECT
           FROM cow.my_binding_elsewhere))) OR cow._read_gate()) AND (_cow_s = COALESCE(current_setting('cow.session_id'::text, true), ''::text)) AND
        CASE _cow_k
            WHEN 1 THEN true
            ELSE ((current_setting('cow.session_id'::text, true) <> ''::text) AND _cow_cur AND (NOT _cow_del))
        END AND (NOT (EXISTS ( SELECT 1
           FROM cow_changes.t3 x
          WHERE ((x._cow_session = current_setting('cow.session_id'::text, true)) AND x._cow_current AND ((x.id IS NOT NULL) = u._cow_b) AND (x.id = u.id))))));

