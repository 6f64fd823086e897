package main

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// Role kinds (Role.Kind): what a function's database role may do.
const (
	// KindRelay may read outbox_event and update its rows (publication and relay bookkeeping),
	// read outbox_control, and execute sluice_horizon() (what holds back VACUUM, without other
	// sessions' query text). Nothing else.
	KindRelay = "relay"
	// KindConsumer may read, insert, update and delete inbox_event rows of its own consumer name
	// (row level security), plus the grants it declares. The batched commit mode deletes the
	// rows it inserted for records that did not finish before it commits.
	KindConsumer = "consumer"
)

// RolesProperty is the custom resource property listing the roles to create (a JSON array of Role).
const RolesProperty = "Roles"

// Role is one function's database role, created (or updated) after the migrations ran.
type Role struct {
	// Name is the PostgreSQL role name. Required.
	Name string `json:"Name"`
	// Kind is KindRelay or KindConsumer. Required.
	Kind string `json:"Kind"`
	// SecretArn names the role's Secrets Manager secret. It holds at least a username (equal to
	// Name) and a password; the handler sets that password on the role and completes the secret
	// with the database's host, port, dbname and engine (the RDS JSON shape). Required.
	SecretArn string `json:"SecretArn"`
	// Consumer is the inbox consumer name whose rows a KindConsumer role may touch.
	Consumer string `json:"Consumer,omitempty"`
	// WALPublication, on a KindRelay role, is the publication a relay that follows the WAL reads
	// (outbox.WALWake): the handler creates it when missing (outbox.PublicationSQL; it needs
	// outbox_event's owner) and lets the role open replication connections (rds_replication
	// on RDS, the REPLICATION attribute elsewhere).
	WALPublication string `json:"WALPublication,omitempty"`
	// Grants are further privileges, e.g. on the tables a consumer's handlers write.
	Grants []Grant `json:"Grants,omitempty"`
}

// Grant is a privilege on a table or a schema.
type Grant struct {
	// Table is a table name, optionally schema-qualified ("invoice", "billing.invoice").
	Table string `json:"Table,omitempty"`
	// Schema is a schema name; set either Table or Schema.
	Schema string `json:"Schema,omitempty"`
	// Privileges are SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER (tables) or
	// USAGE, CREATE (schemas).
	Privileges []string `json:"Privileges"`
}

var (
	identifier       = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)
	tablePrivileges  = []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"}
	schemaPrivileges = []string{"USAGE", "CREATE"}
)

// validate reports every problem of the role list at once.
func validateRoles(roles []Role) error {
	var errs []error
	seen := map[string]bool{}
	for i, r := range roles {
		at := fmt.Sprintf("Roles[%d] (%s)", i, r.Name)
		if !identifier.MatchString(r.Name) {
			errs = append(errs, fmt.Errorf("%s: Name must be a lower-case PostgreSQL identifier of at most 63 bytes", at))
		}
		if seen[r.Name] {
			errs = append(errs, fmt.Errorf("%s: role listed twice", at))
		}
		seen[r.Name] = true
		if r.SecretArn == "" {
			errs = append(errs, fmt.Errorf("%s: SecretArn is required", at))
		}
		if r.WALPublication != "" && (r.Kind != KindRelay || !identifier.MatchString(r.WALPublication)) {
			errs = append(errs, fmt.Errorf("%s: WALPublication must be a lower-case PostgreSQL identifier, on a relay role", at))
		}
		switch r.Kind {
		case KindRelay:
		case KindConsumer:
			if r.Consumer == "" {
				errs = append(errs, fmt.Errorf("%s: a consumer role needs its Consumer name", at))
			}
		default:
			errs = append(errs, fmt.Errorf("%s: Kind must be %q or %q, got %q", at, KindRelay, KindConsumer, r.Kind))
		}
		for j, g := range r.Grants {
			if err := g.validate(); err != nil {
				errs = append(errs, fmt.Errorf("%s: Grants[%d]: %w", at, j, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (g Grant) validate() error {
	allowed := tablePrivileges
	switch {
	case (g.Table == "") == (g.Schema == ""):
		return errors.New("set exactly one of Table and Schema")
	case g.Schema != "":
		allowed = schemaPrivileges
		if !identifier.MatchString(g.Schema) {
			return fmt.Errorf("schema %q is not a lower-case PostgreSQL identifier", g.Schema)
		}
	default:
		for _, part := range strings.Split(g.Table, ".") {
			if !identifier.MatchString(part) || strings.Count(g.Table, ".") > 1 {
				return fmt.Errorf("table %q is not a lower-case, optionally schema-qualified PostgreSQL identifier", g.Table)
			}
		}
	}
	if len(g.Privileges) == 0 {
		return errors.New("no Privileges")
	}
	for _, p := range g.Privileges {
		if !slices.Contains(allowed, p) {
			return fmt.Errorf("privilege %q is not one of %s", p, strings.Join(allowed, ", "))
		}
	}
	return nil
}

// object renders the grant's target for GRANT/REVOKE.
func (g Grant) object() string {
	if g.Schema != "" {
		return "SCHEMA " + pgx.Identifier{g.Schema}.Sanitize()
	}
	return "TABLE " + pgx.Identifier(strings.Split(g.Table, ".")).Sanitize()
}

// key identifies a (role, object, privilege) triple, for revoking what an update removed.
func (g Grant) keys(role string) []string {
	out := make([]string, len(g.Privileges))
	for i, p := range g.Privileges {
		out[i] = role + "\x00" + g.object() + "\x00" + p
	}
	return out
}

// parseRoles reads the Roles property of a custom resource event (absent: no roles).
func parseRoles(props map[string]any) ([]Role, error) {
	raw, ok := props[RolesProperty]
	if !ok || raw == nil {
		return nil, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("property %s: %w", RolesProperty, err)
	}
	var roles []Role
	if err := json.Unmarshal(b, &roles); err != nil {
		return nil, fmt.Errorf("property %s is not a list of roles: %w", RolesProperty, err)
	}
	return roles, validateRoles(roles)
}

// secretStore is what the handler needs from Secrets Manager for role secrets.
type secretStore interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
	PutSecretValue(ctx context.Context, in *secretsmanager.PutSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.PutSecretValueOutput, error)
}

var _ secretStore = (*secretsmanager.Client)(nil)

// endpoint is where the role secrets point: the database the handler migrated.
type endpoint struct {
	Host   string
	Port   uint16
	DBName string
}

// applyRoles creates or updates every role with its password, privileges and, for consumers,
// row level security policy, in one transaction; it revokes the grants and logins that old (the
// previous properties on an Update) had and roles no longer have. Then it completes each role's
// secret with the database endpoint.
func applyRoles(ctx context.Context, conn *pgx.Conn, secrets secretStore, at endpoint, roles, old []Role) error {
	if len(roles) == 0 && len(old) == 0 {
		return nil
	}
	if secrets == nil {
		return errors.New("a Secrets Manager client is needed for the role secrets")
	}
	type roleSecret struct {
		fields   map[string]any
		password string
	}
	loaded := make([]roleSecret, len(roles))
	for i, r := range roles {
		out, err := secrets.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(r.SecretArn)})
		if err != nil {
			return fmt.Errorf("read the secret of role %s: %w", r.Name, err)
		}
		var fields map[string]any
		if err := json.Unmarshal([]byte(aws.ToString(out.SecretString)), &fields); err != nil {
			return fmt.Errorf("the secret of role %s is not a JSON object: %w", r.Name, err)
		}
		user, _ := fields["username"].(string)
		password, _ := fields["password"].(string)
		if user != r.Name || password == "" {
			return fmt.Errorf("the secret of role %s must hold username %q and a password (it has username %q)", r.Name, r.Name, user)
		}
		loaded[i] = roleSecret{fields: fields, password: password}
	}

	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// Several stacks (or a deploy and an operator) may set up roles on one database at once.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('sluice-migrate-roles'))"); err != nil {
			return err
		}
		keep := map[string]bool{}
		for i, r := range roles {
			if err := applyRole(ctx, tx, r, loaded[i].password); err != nil {
				return fmt.Errorf("role %s: %w", r.Name, err)
			}
			for _, g := range r.Grants {
				for _, k := range g.keys(r.Name) {
					keep[k] = true
				}
			}
		}
		current := map[string]bool{}
		for _, r := range roles {
			current[r.Name] = true
		}
		for _, r := range old {
			if !identifier.MatchString(r.Name) {
				continue
			}
			exists, err := roleExists(ctx, tx, r.Name)
			if err != nil || !exists {
				if err != nil {
					return err
				}
				continue
			}
			ident := pgx.Identifier{r.Name}.Sanitize()
			for _, g := range r.Grants {
				if g.validate() != nil {
					continue
				}
				for i, k := range g.keys(r.Name) {
					if keep[k] {
						continue
					}
					if _, err := tx.Exec(ctx, "REVOKE "+g.Privileges[i]+" ON "+g.object()+" FROM "+ident); err != nil && !isUndefinedObject(err) {
						return fmt.Errorf("revoke %s on %s from %s: %w", g.Privileges[i], g.object(), r.Name, err)
					}
				}
			}
			if !current[r.Name] {
				// A role that no function uses any more keeps its objects (it may own some) but
				// can no longer log in.
				if _, err := tx.Exec(ctx, "ALTER ROLE "+ident+" NOLOGIN"); err != nil {
					return fmt.Errorf("disable the login of the removed role %s: %w", r.Name, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}

	for i, r := range roles {
		want := map[string]any{"engine": "postgres", "host": at.Host, "port": float64(at.Port), "dbname": at.DBName}
		fields, changed := loaded[i].fields, false
		for k, v := range want {
			if fields[k] != v {
				fields[k], changed = v, true
			}
		}
		if !changed {
			continue
		}
		b, err := json.Marshal(fields)
		if err != nil {
			return err
		}
		if _, err := secrets.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{SecretId: aws.String(r.SecretArn), SecretString: aws.String(string(b))}); err != nil {
			return fmt.Errorf("complete the secret of role %s with the database endpoint: %w", r.Name, err)
		}
	}
	return nil
}

func roleExists(ctx context.Context, tx pgx.Tx, name string) (bool, error) {
	var exists bool
	err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", name).Scan(&exists)
	return exists, err
}

// applyRole creates or updates one role: login with the secret's password (sent as a SCRAM
// verifier, so the password itself reaches neither the server nor its logs), its kind's
// privileges and its grants.
func applyRole(ctx context.Context, tx pgx.Tx, r Role, password string) error {
	exists, err := roleExists(ctx, tx, r.Name)
	if err != nil {
		return err
	}
	ident := pgx.Identifier{r.Name}.Sanitize()
	verifier, err := scramVerifier(password)
	if err != nil {
		return err
	}
	stmt := "CREATE ROLE " + ident
	if exists {
		stmt = "ALTER ROLE " + ident
	}
	// The verifier is base64 and '$', ':' and digits: nothing to escape in a string literal. A new
	// role has no attribute beyond LOGIN (NOSUPERUSER, NOCREATEROLE, NOBYPASSRLS ... are the
	// defaults; RDS's master user may not even name them in ALTER ROLE).
	if _, err := tx.Exec(ctx, stmt+" LOGIN PASSWORD '"+verifier+"'"); err != nil {
		return fmt.Errorf("create or alter the role: %w", err)
	}
	// The privileges of the role's kind are the published plain SQL (migrations/grants), the
	// same file a team that runs its own migrations applies with psql.
	var sqls []string
	switch r.Kind {
	case KindRelay:
		if err := applyGrants(ctx, tx, "relay.sql", map[string]string{"role": r.Name}); err != nil {
			return err
		}
		// Earlier versions granted pg_read_all_stats, which shows the relay every session's
		// query with its literals; the horizon metric reads sluice_horizon() instead.
		var stats bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_auth_members m
			WHERE m.member = $1::regrole AND m.roleid = 'pg_read_all_stats'::regrole)`, r.Name).Scan(&stats); err != nil {
			return err
		}
		if stats {
			sqls = append(sqls, "REVOKE pg_read_all_stats FROM "+ident)
		}
		if r.WALPublication != "" {
			wal, err := walWakeGrants(ctx, tx, r.WALPublication, ident)
			if err != nil {
				return err
			}
			sqls = append(sqls, wal...)
		}
	case KindConsumer:
		if err := applyGrants(ctx, tx, "consumer.sql", map[string]string{"role": r.Name, "consumer": r.Consumer, "policy": "sluice_inbox_" + r.Name}); err != nil {
			return err
		}
	}
	for _, g := range r.Grants {
		sqls = append(sqls, "GRANT "+strings.Join(g.Privileges, ", ")+" ON "+g.object()+" TO "+ident)
	}
	for _, s := range sqls {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// applyGrants runs the grant file migrations/grants/<name> with vars as its psql variables.
func applyGrants(ctx context.Context, tx pgx.Tx, name string, vars map[string]string) error {
	sql, err := renderGrants(name, vars)
	if err != nil {
		return err
	}
	// Without arguments, Exec sends the file as one simple-protocol query: every statement runs.
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("apply migrations/grants/%s: %w", name, err)
	}
	return nil
}

// psqlVariable is a psql variable interpolation as the grant files use them: :"name" (an
// identifier) or :'name' (a string literal).
var psqlVariable = regexp.MustCompile(`:"([a-z_]+)"|:'([a-z_]+)'`)

// renderGrants returns the grant file migrations/grants/<name> with its psql variables replaced
// by vars' values, quoted as psql quotes them, so the file runs as one multi-statement string.
func renderGrants(name string, vars map[string]string) (string, error) {
	body, err := fs.ReadFile(migrations.FS, "grants/"+name)
	if err != nil {
		return "", fmt.Errorf("read the grants %s: %w", name, err)
	}
	var missing []string
	out := psqlVariable.ReplaceAllStringFunc(string(body), func(m string) string {
		sub := psqlVariable.FindStringSubmatch(m)
		if sub[1] != "" {
			v, ok := vars[sub[1]]
			if !ok {
				missing = append(missing, sub[1])
			}
			return pgx.Identifier{v}.Sanitize()
		}
		v, ok := vars[sub[2]]
		if !ok {
			missing = append(missing, sub[2])
		}
		return quoteLiteral(v)
	})
	if len(missing) > 0 {
		slices.Sort(missing)
		return "", fmt.Errorf("the grants %s use variables without a value: %s", name, strings.Join(slices.Compact(missing), ", "))
	}
	return out, nil
}

// quoteLiteral quotes s as a string literal as libpq's PQescapeLiteral (psql's :'name') does:
// quotes doubled, and, when s holds a backslash, an E'...' literal with backslashes doubled, which
// reads the same whatever standard_conforming_strings is.
func quoteLiteral(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		q = "E'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", "''") + "'"
	}
	return q
}

func isUndefinedObject(err error) bool {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		switch pgErr.SQLState() {
		case "42P01", "3F000", "42704": // undefined table, schema, object
			return true
		}
	}
	return false
}

// scramIterations is PostgreSQL's default scram_iterations.
const scramIterations = 4096

// scramVerifier returns the SCRAM-SHA-256 verifier PostgreSQL stores for password
// (RFC 5802/7677 as PostgreSQL's libpq computes it in PQencryptPasswordConn), with a random salt.
func scramVerifier(password string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	return scramVerifierWithSalt(password, salt, scramIterations)
}

func scramVerifierWithSalt(password string, salt []byte, iterations int) (string, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("derive the SCRAM key: %w", err)
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	clientKey := mac(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return "SCRAM-SHA-256$" + strconv.Itoa(iterations) + ":" + b64(salt) + "$" + b64(storedKey[:]) + ":" + b64(serverKey), nil
}

// sortedRoleNames is for logs.
func sortedRoleNames(roles []Role) []string {
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = r.Name
	}
	sort.Strings(names)
	return names
}

// walWakeGrants returns the statements that let a relay role follow the WAL through
// publication: the publication, when missing, and the right to replicate — membership of
// rds_replication where that role exists (RDS), else the REPLICATION attribute.
func walWakeGrants(ctx context.Context, tx pgx.Tx, publication, ident string) ([]string, error) {
	var sqls []string
	var exists, rds bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
		EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication')`, publication).Scan(&exists, &rds); err != nil {
		return nil, err
	}
	if !exists {
		sqls = append(sqls, outbox.PublicationSQL(publication))
	}
	if rds {
		return append(sqls, "GRANT rds_replication TO "+ident), nil
	}
	return append(sqls, "ALTER ROLE "+ident+" REPLICATION"), nil
}
