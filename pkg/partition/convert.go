package partition

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Plan is what Convert does, for an operator to read first.
type Plan struct {
	// Table is the table's name.
	Table string
	// Rows is PostgreSQL's estimate of the plain table's rows: none is copied or moved.
	Rows int64
	// Position is where new rows are now, as a key: the last id taken (outbox) or now (inbox,
	// Unix microseconds: see Table.Time).
	Position int64
	// Rate is the observed rate of new ids per second (outbox; 0: unknown).
	Rate float64
	// Size is how many keys each new partition spans: ids from Rate and Interval (at least
	// MinSize) for the outbox, Interval in microseconds for the inbox.
	Size int64
	// Bound: the plain table becomes the partition of keys below it, [MINVALUE, Bound).
	Bound int64
	// Resume: an earlier conversion added the bound; this one finishes it.
	Resume bool
	// Steps say what the conversion does, in order; Notes what changes for users.
	Steps, Notes []string
}

func planConversion(ctx context.Context, q Querier, spec tableSpec, opts Options) (Plan, tableInfo, error) {
	info, err := readInfo(ctx, q, spec)
	if err != nil {
		return Plan{}, info, err
	}
	switch {
	case !info.Exists:
		return Plan{}, info, fmt.Errorf("%s: %w", spec.Table, ErrNotMigrated)
	case info.Partitioned:
		return Plan{}, info, fmt.Errorf("%s: %w", spec.Table, ErrPartitioned)
	}
	if err := preflight(ctx, q, spec, info); err != nil {
		return Plan{}, info, err
	}
	plan := Plan{Table: spec.Table}
	if err := q.QueryRow(ctx, "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass($1)", spec.Table).Scan(&plan.Rows); err != nil {
		return plan, info, fmt.Errorf("estimate the rows of %s: %w", spec.Table, err)
	}
	if plan.Position, err = position(ctx, q, info, spec); err != nil {
		return plan, info, err
	}
	if plan.Size, plan.Rate, err = size(ctx, q, info, spec, opts, plan.Position); err != nil {
		return plan, info, err
	}
	switch {
	case info.Bound != 0:
		plan.Bound, plan.Resume = info.Bound, true
	case spec.Kind == timeKey:
		plan.Bound = alignUp(plan.Position+plan.Size, plan.Size)
	default:
		// New rows must not reach the bound while the table is validated: leave them at least
		// an hour at the observed rate, whatever the partitions' size.
		plan.Bound = plan.Position + max(plan.Size, int64(math.Ceil(plan.Rate*3600)))
	}
	if plan.Position >= plan.Bound {
		return plan, info, fmt.Errorf("%s: new rows reached the bound %s of the unfinished conversion (CHECK %s refuses them): "+
			"drop that constraint and convert again", spec.Table, spec.boundText(plan.Bound), spec.boundConstraint())
	}
	plan.Steps, plan.Notes = conversionSteps(ctx, q, spec, opts, info, plan)
	return plan, info, nil
}

// conversionSteps describes the conversion for people.
func conversionSteps(ctx context.Context, q Querier, spec tableSpec, opts Options, info tableInfo, plan Plan) (steps, notes []string) {
	p0 := spec.partName(minBound)
	reach := "one Interval (" + opts.Interval.String() + ")"
	if spec.Kind == identityKey {
		reach = "an unknown time (no rate observed yet)"
		if plan.Rate > 0 {
			reach = "about " + (time.Duration(float64(plan.Bound-plan.Position)/plan.Rate) * time.Second).Round(time.Minute).String() + " at the observed rate"
		}
	}
	check := fmt.Sprintf("CHECK (%s < %s)", spec.Column, spec.boundValue(plan.Bound))
	if info.Bound == 0 {
		steps = append(steps, fmt.Sprintf("add %s NOT VALID to %s, as constraint %s (a brief ACCESS EXCLUSIVE lock); from then on new rows must stay below the bound, which they reach in %s",
			check, spec.Table, spec.boundConstraint(), reach))
	}
	if !info.BoundValid {
		steps = append(steps, fmt.Sprintf("validate that CHECK: reads the whole table (about %d rows) under a SHARE UPDATE EXCLUSIVE lock; writers continue", max(plan.Rows, 0)))
	}
	for _, ix := range spec.ExtraIndexes {
		name := trunc(p0 + "_" + strings.TrimPrefix(ix.Name, spec.Table+"_"))
		if ok, _, _ := indexState(ctx, q, info, name); !ok {
			steps = append(steps, fmt.Sprintf("build index %s %s on %s CONCURRENTLY: reads the table; writers continue", name, ix.Using, spec.Table))
		}
	}
	span := fmt.Sprintf("%d ids", plan.Size)
	if spec.Kind == timeKey {
		span = opts.Interval.String()
	}
	steps = append(steps, fmt.Sprintf("in one transaction holding an ACCESS EXCLUSIVE lock on %[1]s for milliseconds (no row is copied or moved): "+
		"rename %[1]s to %[2]s, with its indexes; create the partitioned %[1]s, RANGE (%[3]s), with the same columns, defaults, CHECK constraints, "+
		"identity sequences (continuing where they are), grants, row-level security policies and owner; attach %[2]s as its partition "+
		"[MINVALUE, %[4]s) (the validated CHECK proves the range and its indexes become the partitioned indexes' own: nothing is rebuilt); "+
		"create %[5]d partitions of %[6]s ahead and the default partition %[7]s",
		spec.Table, p0, spec.Column, spec.boundText(plan.Bound), opts.Ahead, span, spec.defaultName()))
	names := make([]string, 0, len(spec.LocalOnly))
	for name := range spec.LocalOnly {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if ok, _, _ := indexState(ctx, q, info, name); ok {
			notes = append(notes, fmt.Sprintf("unique index %s stays on %s only: %s", name, p0, spec.LocalOnly[name]))
		}
	}
	return steps, notes
}

// indexState reports whether the named index exists in the table's schema and is valid.
func indexState(ctx context.Context, q Querier, info tableInfo, name string) (valid, exists bool, err error) {
	err = q.QueryRow(ctx, `SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)`, info.qualified(name)).Scan(&valid)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	return valid, err == nil, err
}

// preflight refuses what PostgreSQL cannot carry over to a partitioned table, or what the
// switch would silently change, naming every problem.
func preflight(ctx context.Context, q Querier, spec tableSpec, info tableInfo) error {
	var problems []string
	list := func(what, sql string, args ...any) error {
		rows, err := q.Query(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("check %s: %w", what, err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("check %s: %w", what, err)
		}
		if len(names) > 0 {
			problems = append(problems, what+": "+strings.Join(names, ", "))
		}
		return nil
	}
	var (
		typ, identity string
		notNull       bool
	)
	err := q.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod), attidentity::text, attnotnull FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped`, spec.Table, spec.Column).Scan(&typ, &identity, &notNull)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		problems = append(problems, fmt.Sprintf("column %s, the partition key, is missing", spec.Column))
	case err != nil:
		return fmt.Errorf("check column %s of %s: %w", spec.Column, spec.Table, err)
	case spec.Kind == identityKey && (typ != "bigint" || identity == ""):
		problems = append(problems, fmt.Sprintf("column %s, the partition key, must be a bigint identity column (it is %s)", spec.Column, typ))
	case spec.Kind == timeKey && (typ != "timestamp with time zone" || !notNull):
		problems = append(problems, fmt.Sprintf("column %s, the partition key, must be timestamptz NOT NULL (it is %s)", spec.Column, typ))
	}
	localOnly := make([]string, 0, len(spec.LocalOnly))
	for name := range spec.LocalOnly {
		localOnly = append(localOnly, name)
	}
	table, p0 := spec.Table, spec.partName(minBound)
	checks := []struct {
		what, sql string
		args      []any
	}{
		{"it is in an inheritance hierarchy", `SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = to_regclass($1)
			UNION ALL SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = to_regclass($1)`, []any{table}},
		{"triggers on it (drop them first; a partitioned table runs row triggers on every partition)",
			`SELECT tgname::text FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal`, []any{table}},
		{"rules on it", `SELECT rulename::text FROM pg_rewrite WHERE ev_class = to_regclass($1) AND rulename <> '_RETURN'`, []any{table}},
		{"views or materialized views that read it (they would keep reading the former table only: drop them first, create them again after)",
			`SELECT DISTINCT r.ev_class::regclass::text FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
			 WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass AND d.refobjid = to_regclass($1) AND r.ev_class <> to_regclass($1)`, []any{table}},
		{"foreign keys from or to it", `SELECT conname::text FROM pg_constraint WHERE contype = 'f' AND (conrelid = to_regclass($1) OR confrelid = to_regclass($1))`, []any{table}},
		{"exclusion constraints", `SELECT conname::text FROM pg_constraint WHERE contype = 'x' AND conrelid = to_regclass($1)`, []any{table}},
		{"publications that name it (logical replication)", `SELECT p.pubname::text FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid WHERE r.prrelid = to_regclass($1)`, []any{table}},
		{"column privileges (not carried over: grant them on the partitioned table after)", `SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND attacl IS NOT NULL`, []any{table}},
		{"invalid indexes (drop or rebuild them first)", `SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			WHERE i.indrelid = to_regclass($1) AND NOT i.indisvalid AND NOT c.relname LIKE $2 || '\_%'`, []any{table, p0}},
		{"unique indexes without the partition key, which PostgreSQL cannot enforce across partitions (drop them, or add " + spec.Column + " to them)",
			`SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			 WHERE i.indrelid = to_regclass($1) AND i.indisunique AND NOT c.relname = ANY($2)
			   AND NOT (SELECT attnum FROM pg_attribute WHERE attrelid = i.indrelid AND attname = $3) = ANY(i.indkey::int2[])`, []any{table, localOnly, spec.Column}},
	}
	for _, c := range checks {
		if err := list(c.what, c.sql, c.args...); err != nil {
			return err
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("cannot convert %s to a partitioned table, nothing was changed: %s", spec.Table, strings.Join(problems, "; "))
	}
	return nil
}

// convert turns the plain table into a partitioned one without copying a row: the plain table
// becomes the partition [MINVALUE, Bound) of a new partitioned table of the same name, and
// partitions are created ahead of it. Every row stays where it is, with its id; nothing is
// deleted. It reports each step to progress (which may be nil) as it completes. Steps done by
// an earlier, interrupted run are not repeated.
//
// Locks: adding the bound takes a brief ACCESS EXCLUSIVE lock; validating it and building the
// extra indexes read the whole table while writers continue; the switch holds an ACCESS
// EXCLUSIVE lock on the table for the few milliseconds its catalog changes take. Each lock is
// waited for at most opts.LockTimeout; a conversion that cannot get one stops and can be run
// again.
func convert(ctx context.Context, db DB, spec tableSpec, opts Options, progress func(string)) (Plan, error) {
	plan, info, err := planConversion(ctx, db, spec, opts)
	if err != nil {
		return plan, err
	}
	step := func(format string, args ...any) {
		if progress != nil {
			progress(fmt.Sprintf(format, args...))
		}
	}
	qt := info.qualified(spec.Table)
	bound := pgx.Identifier{spec.boundConstraint()}.Sanitize()
	if info.Bound == 0 {
		err := inTx(ctx, db, spec, opts, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "ALTER TABLE "+qt+" ADD CONSTRAINT "+bound+" CHECK ("+pgx.Identifier{spec.Column}.Sanitize()+
				" < "+spec.boundValue(plan.Bound)+") NOT VALID")
			return err
		})
		if err != nil {
			return plan, fmt.Errorf("add the partition bound to %s: %w", spec.Table, hint(err, opts))
		}
		step("added CHECK (%s < %s) NOT VALID to %s", spec.Column, spec.boundText(plan.Bound), spec.Table)
	}
	if !info.BoundValid {
		if _, err := db.Exec(ctx, "ALTER TABLE "+qt+" VALIDATE CONSTRAINT "+bound); err != nil {
			return plan, fmt.Errorf("validate the partition bound of %s: %w", spec.Table, err)
		}
		step("validated the bound: every row of %s has %s below %s", spec.Table, spec.Column, spec.boundText(plan.Bound))
	}
	p0 := spec.partName(minBound)
	for _, ix := range spec.ExtraIndexes {
		name := trunc(p0 + "_" + strings.TrimPrefix(ix.Name, spec.Table+"_"))
		valid, exists, err := indexState(ctx, db, info, name)
		if err != nil {
			return plan, fmt.Errorf("look for index %s: %w", name, err)
		}
		if valid {
			continue
		}
		if exists { // left invalid by an interrupted build
			if _, err := db.Exec(ctx, "DROP INDEX CONCURRENTLY "+info.qualified(name)); err != nil {
				return plan, fmt.Errorf("drop the invalid index %s: %w", name, err)
			}
		}
		if _, err := db.Exec(ctx, "CREATE INDEX CONCURRENTLY "+pgx.Identifier{name}.Sanitize()+" ON "+qt+" "+ix.Using); err != nil {
			return plan, fmt.Errorf("build index %s on %s: %w", name, spec.Table, err)
		}
		step("built index %s %s", name, ix.Using)
	}
	var made []string
	err = inTx(ctx, db, spec, opts, func(tx pgx.Tx) error {
		var err error
		made, err = switchOver(ctx, tx, spec, opts, plan)
		return err
	})
	if err != nil {
		return plan, fmt.Errorf("switch %s to the partitioned table: %w", spec.Table, hint(err, opts))
	}
	step("%s is partitioned by RANGE (%s): %s holds every earlier row; created %s", spec.Table, spec.Column, p0, strings.Join(made, ", "))
	return plan, nil
}

// hint adds what to do after a lock timeout.
func hint(err error, opts Options) error {
	if isLockTimeout(err) {
		return fmt.Errorf("%w (the lock was not granted within %s: long transactions hold the table; nothing was changed by this step, run the conversion again)", err, opts.LockTimeout)
	}
	return err
}

// switchOver is the conversion's one short transaction; see Convert. It returns the
// partitions it created.
func switchOver(ctx context.Context, tx pgx.Tx, spec tableSpec, opts Options, plan Plan) ([]string, error) {
	exec := func(sql string, args ...any) error {
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		return nil
	}
	if err := exec("SET LOCAL statement_timeout = 60000"); err != nil {
		return nil, err
	}
	if err := exec("LOCK TABLE " + pgx.Identifier{spec.Table}.Sanitize() + " IN ACCESS EXCLUSIVE MODE"); err != nil {
		return nil, err
	}
	info, err := readInfo(ctx, tx, spec)
	if err != nil {
		return nil, err
	}
	if info.Partitioned || !info.BoundValid || info.Bound != plan.Bound {
		return nil, fmt.Errorf("%s changed while converting (partitioned %v, bound %s valid %v): run the conversion again",
			spec.Table, info.Partitioned, spec.boundText(info.Bound), info.BoundValid)
	}
	pos, err := position(ctx, tx, info, spec)
	if err != nil {
		return nil, err
	}
	if pos >= plan.Bound {
		return nil, fmt.Errorf("new rows of %s reached the bound %s: drop constraint %s and convert again", spec.Table, spec.boundText(plan.Bound), spec.boundConstraint())
	}
	qt, p0 := info.qualified(spec.Table), spec.partName(minBound)
	qp0 := info.qualified(p0)

	// What the new table must carry over, read before anything is renamed.
	type index struct {
		name, def, conName, conDef string
		unique, hasKey             bool
	}
	rows, err := tx.Query(ctx, `
		SELECT c.relname, pg_get_indexdef(i.indexrelid), coalesce(con.conname, ''), coalesce(pg_get_constraintdef(con.oid), ''), i.indisunique,
		       (SELECT attnum FROM pg_attribute WHERE attrelid = i.indrelid AND attname = $2) = ANY(i.indkey::int2[])
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid AND con.contype IN ('p', 'u')
		WHERE i.indrelid = to_regclass($1) ORDER BY c.relname`, spec.Table, spec.Column)
	if err != nil {
		return nil, fmt.Errorf("list the indexes of %s: %w", spec.Table, err)
	}
	var indexes []index
	var ix index
	if _, err := pgx.ForEachRow(rows, []any{&ix.name, &ix.def, &ix.conName, &ix.conDef, &ix.unique, &ix.hasKey}, func() error {
		indexes = append(indexes, ix)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list the indexes of %s: %w", spec.Table, err)
	}
	type identity struct {
		col, kind, seq                string
		increment, minValue, maxValue int64
		cache, last                   int64
		cycle, called                 bool
	}
	rows, err = tx.Query(ctx, `
		SELECT a.attname, a.attidentity::text, s.seqrelid::regclass::text, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle
		FROM pg_attribute a
		JOIN pg_sequence s ON s.seqrelid = pg_get_serial_sequence($2, a.attname)::regclass
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attidentity <> ''`, spec.Table, qt)
	if err != nil {
		return nil, fmt.Errorf("read the identity columns of %s: %w", spec.Table, err)
	}
	var identities []identity
	var id identity
	if _, err := pgx.ForEachRow(rows, []any{&id.col, &id.kind, &id.seq, &id.increment, &id.minValue, &id.maxValue, &id.cache, &id.cycle}, func() error {
		identities = append(identities, id)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read the identity columns of %s: %w", spec.Table, err)
	}
	for i := range identities {
		if err := tx.QueryRow(ctx, "SELECT last_value, is_called FROM "+identities[i].seq).Scan(&identities[i].last, &identities[i].called); err != nil {
			return nil, fmt.Errorf("read sequence %s: %w", identities[i].seq, err)
		}
	}
	var carry []string // statements that give the new table what the plain table had
	rows, err = tx.Query(ctx, `
		SELECT format('GRANT %s ON TABLE %s TO %s%s', a.privilege_type, $2::text,
		              CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
		              CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
		FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
		WHERE c.oid = to_regclass($1) AND a.grantee <> c.relowner
		UNION ALL
		SELECT 'ALTER TABLE ' || $2::text || ' ENABLE ROW LEVEL SECURITY' FROM pg_class WHERE oid = to_regclass($1) AND relrowsecurity
		UNION ALL
		SELECT 'ALTER TABLE ' || $2::text || ' FORCE ROW LEVEL SECURITY' FROM pg_class WHERE oid = to_regclass($1) AND relforcerowsecurity
		UNION ALL
		SELECT format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s', p.polname, $2::text,
		              CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
		              CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
		              (SELECT string_agg(CASE WHEN r = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r)) END, ', ') FROM unnest(p.polroles) r),
		              coalesce(' USING (' || pg_get_expr(p.polqual, p.polrelid) || ')', ''),
		              coalesce(' WITH CHECK (' || pg_get_expr(p.polwithcheck, p.polrelid) || ')', ''))
		FROM pg_policy p WHERE p.polrelid = to_regclass($1)
		UNION ALL
		SELECT format('COMMENT ON TABLE %s IS %L', $2::text, d) FROM obj_description(to_regclass($1), 'pg_class') d WHERE d IS NOT NULL`, spec.Table, qt)
	if err != nil {
		return nil, fmt.Errorf("read the grants and policies of %s: %w", spec.Table, err)
	}
	if carry, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, fmt.Errorf("read the grants and policies of %s: %w", spec.Table, err)
	}

	// The plain table steps aside with its indexes, and gives up its identity sequences.
	stmts := []string{"ALTER TABLE " + qt + " RENAME TO " + pgx.Identifier{p0}.Sanitize()}
	for _, ix := range indexes {
		if strings.HasPrefix(ix.name, p0+"_") {
			continue // built for the conversion under its final name
		}
		stmts = append(stmts, "ALTER INDEX "+info.qualified(ix.name)+" RENAME TO "+pgx.Identifier{trunc(p0 + "_" + strings.TrimPrefix(ix.name, spec.Table+"_"))}.Sanitize())
	}
	for _, id := range identities {
		stmts = append(stmts, "ALTER TABLE "+qp0+" ALTER COLUMN "+pgx.Identifier{id.col}.Sanitize()+" DROP IDENTITY")
	}
	// The partitioned table, shaped like it.
	stmts = append(stmts,
		"CREATE TABLE "+qt+" (LIKE "+qp0+" INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS INCLUDING COMPRESSION INCLUDING GENERATED)"+
			" PARTITION BY RANGE ("+pgx.Identifier{spec.Column}.Sanitize()+")",
		"ALTER TABLE "+qt+" DROP CONSTRAINT "+pgx.Identifier{spec.boundConstraint()}.Sanitize())
	for _, id := range identities {
		next := id.last
		if id.called {
			next += id.increment
		}
		kind, cycle := "BY DEFAULT", "NO CYCLE"
		if id.kind == "a" {
			kind = "ALWAYS"
		}
		if id.cycle {
			cycle = "CYCLE"
		}
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s ADD GENERATED %s AS IDENTITY (INCREMENT BY %d MINVALUE %d MAXVALUE %d START WITH %d CACHE %d %s)",
			qt, pgx.Identifier{id.col}.Sanitize(), kind, id.increment, id.minValue, id.maxValue, next, id.cache, cycle))
	}
	for _, ix := range indexes {
		switch {
		case strings.HasPrefix(ix.name, p0+"_"):
			continue
		case ix.unique && !ix.hasKey:
			continue // kept on the former table only (preflight allowed only spec.LocalOnly)
		case ix.conName != "":
			stmts = append(stmts, "ALTER TABLE "+qt+" ADD CONSTRAINT "+pgx.Identifier{ix.conName}.Sanitize()+" "+ix.conDef)
		default:
			using := strings.Index(ix.def, " USING ")
			if using < 0 {
				return nil, fmt.Errorf("cannot read the definition of index %s: %q", ix.name, ix.def)
			}
			unique := ""
			if ix.unique {
				unique = "UNIQUE "
			}
			stmts = append(stmts, "CREATE "+unique+"INDEX "+pgx.Identifier{ix.name}.Sanitize()+" ON "+qt+ix.def[using:])
		}
	}
	for _, ix := range spec.ExtraIndexes {
		stmts = append(stmts, "CREATE INDEX "+pgx.Identifier{ix.Name}.Sanitize()+" ON "+qt+" "+ix.Using)
	}
	// The former table becomes the first partition: its validated CHECK proves the range, so
	// PostgreSQL does not scan it, and its indexes match the partitioned indexes, so they are
	// adopted rather than built.
	stmts = append(stmts,
		"ALTER TABLE "+qt+" ATTACH PARTITION "+qp0+" FOR VALUES FROM (MINVALUE) TO ("+spec.boundValue(plan.Bound)+")",
		"ALTER TABLE "+qp0+" DROP CONSTRAINT "+pgx.Identifier{spec.boundConstraint()}.Sanitize())
	for _, s := range stmts {
		if err := exec(s); err != nil {
			return nil, err
		}
	}
	var made []string
	from := plan.Bound
	for range opts.Ahead {
		to := from + plan.Size
		if spec.Kind == timeKey {
			to = alignUp(from, plan.Size)
		}
		name := spec.partName(from)
		if err := createTable(ctx, tx, spec, info, name); err != nil {
			return nil, err
		}
		if err := exec("ALTER TABLE " + qt + " ATTACH PARTITION " + info.qualified(name) + " FOR VALUES FROM (" + spec.boundValue(from) + ") TO (" + spec.boundValue(to) + ")"); err != nil {
			return nil, err
		}
		made = append(made, spec.describe(Partition{Name: name, From: from, To: to}))
		from = to
	}
	if err := createTable(ctx, tx, spec, info, spec.defaultName()); err != nil {
		return nil, err
	}
	if err := exec("ALTER TABLE " + qt + " ATTACH PARTITION " + info.qualified(spec.defaultName()) + " DEFAULT"); err != nil {
		return nil, err
	}
	made = append(made, spec.defaultName()+" (default)")
	for _, s := range append(carry, "ALTER TABLE "+qt+" OWNER TO "+pgx.Identifier{info.Owner}.Sanitize()) {
		if err := exec(s); err != nil {
			return nil, err
		}
	}
	return made, nil
}
