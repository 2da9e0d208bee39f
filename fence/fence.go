package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Dialect is the SQL dialect of a Table: how it quotes names, numbers placeholders and writes an
// upsert.
type Dialect int

const (
	// PostgreSQL: "quoted" names, $1 placeholders, INSERT ... ON CONFLICT. Tested with pgx's
	// database/sql driver.
	PostgreSQL Dialect = iota + 1
	// MySQL and MariaDB with InnoDB tables: `quoted` names, ? placeholders, INSERT ... ON
	// DUPLICATE KEY UPDATE. Tested with go-sql-driver/mysql on MariaDB.
	MySQL
	// SQLite 3.24 or newer: "quoted" names, ? placeholders, INSERT ... ON CONFLICT. Tested with
	// modernc.org/sqlite.
	SQLite
)

func (d Dialect) String() string {
	switch d {
	case PostgreSQL:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	case SQLite:
		return "SQLite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

var (
	// ErrStale: the row is fenced by a newer token than the caller's, so the caller's lock is no
	// longer the newest on this resource. Nothing was written; the transaction should be rolled
	// back and the work not retried with this token. The error is a *StaleError naming the
	// row's token.
	ErrStale = errors.New("stale fencing token")
	// ErrNoRow: no row has the key (Claim only; Upsert creates the row).
	ErrNoRow = errors.New("no row with this key")
	// ErrInvalid: a Table, token or column list that cannot be used: fix the call.
	ErrInvalid = errors.New("invalid fenced write")
	// ErrLeaseEnded: InTx's lease (or its ctx) ended before COMMIT; the transaction was
	// rolled back. The error also wraps the context's cause (dlock.ErrLost for a lost lock).
	ErrLeaseEnded = errors.New("lease ended")
)

// StaleError is the error of a claim or upsert refused because a newer token holds the row.
// It matches ErrStale.
type StaleError struct {
	Table string // the table's name as given
	Key   any    // the row's key
	Token uint64 // the caller's token
	Held  uint64 // the row's fence, larger than Token
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: %v: row %v of %s is fenced at token %d, newer than this holder's %d: its lock was lost; roll back and do not retry with this token",
		ErrStale, e.Key, e.Table, e.Held, e.Token)
}

// Is makes errors.Is(err, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Table names a table whose rows are fenced: each row carries the largest fencing token that
// has claimed it in its FenceColumn (a 64-bit integer, 0 for a row never claimed).
type Table struct {
	Dialect Dialect
	// Name is the table's name, optionally qualified by a schema (or, for MySQL, a database):
	// "stock" or "shop.stock". Names are quoted, so they are case-sensitive where the database
	// says so (PostgreSQL: a table created without quotes has a lower-case name).
	Name string
	// KeyColumn is the primary key (or a unique, non-null column) that Claim and Upsert find
	// the row by.
	KeyColumn string
	// FenceColumn holds the row's token: BIGINT NOT NULL DEFAULT 0 ("fence" when empty).
	FenceColumn string
}

// identPart is one part of a name: letters, digits and underscores, not starting with a digit,
// at most 63 characters (PostgreSQL's limit; MySQL allows 64).
var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func validName(s string, qualified bool) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 2 || (len(parts) == 2 && !qualified) {
		return false
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return false
		}
	}
	return true
}

// quote quotes a validated name for the dialect, each part of a qualified name on its own.
func (d Dialect) quote(name string) string {
	q := `"`
	if d == MySQL {
		q = "`"
	}
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = q + p + q
	}
	return strings.Join(parts, ".")
}

// ph is the n-th placeholder (from 1).
func (d Dialect) ph(n int) string {
	if d == PostgreSQL {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

func (t Table) fenceColumn() string {
	if t.FenceColumn == "" {
		return "fence"
	}
	return t.FenceColumn
}

// check validates the table's dialect and names.
func (t Table) check() error {
	switch t.Dialect {
	case PostgreSQL, MySQL, SQLite:
	default:
		return fmt.Errorf("fence: %w: table %q has no dialect: set Dialect to fence.PostgreSQL, fence.MySQL or fence.SQLite", ErrInvalid, t.Name)
	}
	if !validName(t.Name, true) {
		return fmt.Errorf("fence: %w: table name %q: use letters, digits and _ (not first), at most 63, optionally schema.table", ErrInvalid, t.Name)
	}
	for _, c := range []struct{ what, name string }{{"key column", t.KeyColumn}, {"fence column", t.fenceColumn()}} {
		if !validName(c.name, false) {
			return fmt.Errorf("fence: %w: %s %q of table %s: use letters, digits and _ (not first), at most 63", ErrInvalid, c.what, c.name, t.Name)
		}
	}
	if strings.EqualFold(t.KeyColumn, t.fenceColumn()) {
		return fmt.Errorf("fence: %w: table %s: the key column and the fence column are both %q", ErrInvalid, t.Name, t.KeyColumn)
	}
	return nil
}

// tokenArg checks a token and converts it for the driver.
func tokenArg(token uint64) (int64, error) {
	if token == 0 || token > math.MaxInt64 {
		return 0, fmt.Errorf("fence: %w: token %d: a lease's token is at least 1 and below 2^63", ErrInvalid, token)
	}
	return int64(token), nil
}

// statements is a table's SQL, built once per Table value.
type statements struct {
	claim     string // args: token, key
	claimArgs func(tok int64, key any) []any
	fence     string // SELECT of the row's fence; args: key
}

var cache sync.Map // Table → *statements, or upsertKey → string

func (t Table) statements() (*statements, error) {
	if s, ok := cache.Load(t); ok {
		return s.(*statements), nil
	}
	if err := t.check(); err != nil {
		return nil, err
	}
	d := t.Dialect
	tbl, key, fc := d.quote(t.Name), d.quote(t.KeyColumn), d.quote(t.fenceColumn())
	s := &statements{}
	if d == PostgreSQL {
		s.claim = fmt.Sprintf("UPDATE %s SET %s = $1 WHERE %s = $2 AND %s <= $1", tbl, fc, key, fc)
		s.claimArgs = func(tok int64, k any) []any { return []any{tok, k} }
	} else {
		s.claim = fmt.Sprintf("UPDATE %s SET %s = ? WHERE %s = ? AND %s <= ?", tbl, fc, key, fc)
		s.claimArgs = func(tok int64, k any) []any { return []any{tok, k, tok} }
	}
	s.fence = fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", fc, tbl, key, d.ph(1))
	if d == MySQL {
		// A locking read: it sees the latest committed row whatever the transaction's
		// snapshot (a plain SELECT under REPEATABLE READ might not), and locks it.
		s.fence += " FOR UPDATE"
	}
	cache.Store(t, s)
	return s, nil
}

// Querier is what Upsert writes through: a *sql.Tx, *sql.DB or *sql.Conn.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Claim moves the fence of the row with this key forward to token, in tx, if no newer token
// holds it: UPDATE ... SET fence = token WHERE key = k AND fence <= token. An equal token
// passes (the same lease, in another transaction or again in this one). The update takes the
// row's write lock until tx ends, so every later read and write of the row in tx is fenced:
// a newer holder's claim waits for tx to end (or fails, per the database's lock timeout) and
// then sees what tx committed. Claim the row before reading it.
//
// When the row is fenced by a newer token, Claim returns a *StaleError (matching ErrStale)
// that names it; when there is no row, an error matching ErrNoRow. Either way nothing was
// written, and tx should be rolled back. A claim that changes the row costs one statement;
// telling why a claim changed nothing costs a second one (and on MySQL so does a re-entry,
// which changes no value: MySQL counts changed rows, not matched ones).
func (t Table) Claim(ctx context.Context, tx *sql.Tx, key any, token uint64) error {
	s, err := t.statements()
	if err != nil {
		return err
	}
	tok, err := tokenArg(token)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		res, err := tx.ExecContext(ctx, s.claim, s.claimArgs(tok, key)...)
		if err != nil {
			return fmt.Errorf("fence: claim row %v of %s: %w", key, t.Name, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("fence: claim row %v of %s: %w", key, t.Name, err)
		} else if n > 0 {
			return nil
		}
		held, done, err := t.whyUnchanged(ctx, tx, s, key, token)
		if err != nil || done {
			return err // refused, or a re-entry on MySQL (the row matched and is locked)
		}
		if attempt < 2 {
			continue // the row appeared between the two statements: claim it
		}
		return fmt.Errorf("fence: claim row %v of %s: the row's fence is %d, below token %d, but the update changed nothing", key, t.Name, held, token)
	}
}

// whyUnchanged tells why a fenced statement on the row changed nothing: a newer token holds it
// (a *StaleError), there is no row (ErrNoRow), or, on MySQL, the same token wrote no new value
// (done: MySQL counts changed rows, not matched ones). Else the row's fence, below the token,
// is returned for the caller to decide.
func (t Table) whyUnchanged(ctx context.Context, q Querier, s *statements, key any, token uint64) (held int64, done bool, err error) {
	held, err = t.rowFence(ctx, q, s, key)
	switch {
	case err != nil:
		return held, false, err
	case uint64(held) > token:
		return held, false, &StaleError{Table: t.Name, Key: key, Token: token, Held: uint64(held)}
	case uint64(held) == token && t.Dialect == MySQL:
		return held, true, nil
	}
	return held, false, nil
}

// rowFence reads the row's fence; ErrNoRow when it is missing.
func (t Table) rowFence(ctx context.Context, q Querier, s *statements, key any) (int64, error) {
	var held int64
	err := q.QueryRowContext(ctx, s.fence, key).Scan(&held)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("fence: %w: %s has no row %v", ErrNoRow, t.Name, key)
	}
	if err != nil {
		return 0, fmt.Errorf("fence: read the fence of row %v of %s: %w", key, t.Name, err)
	}
	return held, nil
}

// upsertKey finds an upsert statement in the cache.
type upsertKey struct {
	t    Table
	cols string
}

// upsertSQL builds the fenced insert-or-update of the given columns (sorted, validated).
func (t Table) upsertSQL(cols []string) (string, error) {
	k := upsertKey{t, strings.Join(cols, ",")}
	if s, ok := cache.Load(k); ok {
		return s.(string), nil
	}
	if err := t.check(); err != nil {
		return "", err
	}
	d := t.Dialect
	fcName := t.fenceColumn()
	for i, c := range cols {
		if !validName(c, false) {
			return "", fmt.Errorf("fence: %w: column %q of table %s: use letters, digits and _ (not first), at most 63", ErrInvalid, c, t.Name)
		}
		if strings.EqualFold(c, t.KeyColumn) || strings.EqualFold(c, fcName) {
			return "", fmt.Errorf("fence: %w: Upsert sets column %q of table %s itself: leave it out of the values", ErrInvalid, c, t.Name)
		}
		if i > 0 && strings.EqualFold(c, cols[i-1]) {
			return "", fmt.Errorf("fence: %w: column %q of table %s given twice", ErrInvalid, c, t.Name)
		}
	}
	tbl, key, fc := d.quote(t.Name), d.quote(t.KeyColumn), d.quote(fcName)
	names := []string{key, fc}
	phs := []string{d.ph(1), d.ph(2)}
	for i, c := range cols {
		names = append(names, d.quote(c))
		phs = append(phs, d.ph(i+3))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "INSERT INTO %s (%s) VALUES (%s) ", tbl, strings.Join(names, ", "), strings.Join(phs, ", "))
	if d == MySQL {
		// Assignments run left to right and see the columns already assigned, so the fence
		// goes last: every IF compares against the row's old fence. A stale write keeps every
		// value, so the row does not change.
		b.WriteString("ON DUPLICATE KEY UPDATE ")
		newer := fmt.Sprintf("%s <= VALUES(%s)", fc, fc)
		for _, c := range append(names[2:], fc) {
			fmt.Fprintf(&b, "%s = IF(%s, VALUES(%s), %s), ", c, newer, c, c)
		}
		s := strings.TrimSuffix(b.String(), ", ")
		cache.Store(k, s)
		return s, nil
	}
	fmt.Fprintf(&b, "ON CONFLICT (%s) DO UPDATE SET ", key)
	for _, c := range append(names[2:], fc) {
		fmt.Fprintf(&b, "%s = excluded.%s, ", c, c)
	}
	// The table's own name, without its schema, stands for the existing row.
	own := d.quote(t.Name[strings.LastIndexByte(t.Name, '.')+1:])
	s := strings.TrimSuffix(b.String(), ", ") + fmt.Sprintf(" WHERE %s.%s <= excluded.%s", own, fc, fc)
	cache.Store(k, s)
	return s, nil
}

// Upsert sets the row with this key to values (column → value), fence included, creating it
// if missing, unless a newer token holds it: one statement, INSERT ... ON CONFLICT (key) DO
// UPDATE ... WHERE fence <= token (PostgreSQL, SQLite) or INSERT ... ON DUPLICATE KEY UPDATE
// with each column kept by IF(fence <= token, new, old) (MySQL). A refused write changes
// nothing and returns a *StaleError (matching ErrStale) naming the row's token, found by a
// second statement. On MySQL a second statement (SELECT ... FOR UPDATE) also tells an insert
// or an unchanged row from a refused write, since MySQL's affected-row count cannot.
//
// q is usually the transaction that claimed other rows (Upsert takes the row's lock like
// Claim); a *sql.DB runs it on its own. values must not name the key or fence columns; nil or
// empty values create or claim the row with its other columns' defaults.
func (t Table) Upsert(ctx context.Context, q Querier, key any, token uint64, values map[string]any) error {
	tok, err := tokenArg(token)
	if err != nil {
		return err
	}
	cols := make([]string, 0, len(values))
	for c := range values {
		cols = append(cols, c)
	}
	slices.Sort(cols)
	query, err := t.upsertSQL(cols)
	if err != nil {
		return err
	}
	args := make([]any, 0, len(cols)+2)
	args = append(args, key, tok)
	for _, c := range cols {
		args = append(args, values[c])
	}
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("fence: upsert row %v of %s: %w", key, t.Name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("fence: upsert row %v of %s: %w", key, t.Name, err)
	}
	if t.Dialect == MySQL {
		if n == 2 { // an existing row changed, which only a fresh-enough token can do
			return nil
		}
		// 1: inserted, or (with the clientFoundRows option) found; 0: unchanged. Look.
	} else if n > 0 {
		return nil
	}
	s, err := t.statements()
	if err != nil {
		return err
	}
	held, err := t.rowFence(ctx, q, s, key)
	if err != nil {
		return err
	}
	if held > tok {
		return &StaleError{Table: t.Name, Key: key, Token: token, Held: uint64(held)}
	}
	return nil
}

// Update is a fenced write of the row with this key in one statement: UPDATE <table> SET <set>,
// fence = token WHERE key = k AND fence <= token. set is the caller's own SQL for the columns
// (for instance "qty = qty - ?"; on PostgreSQL its placeholders are $1 … $len(args)), with args
// for its placeholders; the table's names and the token are added by Update. It is the whole
// fenced transaction for a write that needs no read first: the same round trips as the
// unfenced statement. A write computed from a read (read, decide, write) needs Claim first,
// so that the read is fenced too.
//
// set is SQL: write it in the program, never from input. Like Claim, Update returns a
// *StaleError (matching ErrStale) when a newer token holds the row and ErrNoRow when there is
// none, having written nothing; telling which costs a second statement, run only then (and on
// MySQL for a write that changes no value, which MySQL reports as no row changed).
func (t Table) Update(ctx context.Context, q Querier, key any, token uint64, set string, args ...any) error {
	s, err := t.statements()
	if err != nil {
		return err
	}
	tok, err := tokenArg(token)
	if err != nil {
		return err
	}
	if strings.TrimSpace(set) == "" {
		return fmt.Errorf("fence: %w: Update of %s with nothing to set", ErrInvalid, t.Name)
	}
	d := t.Dialect
	all := append(append(make([]any, 0, len(args)+3), args...), tok, key)
	if d != PostgreSQL {
		all = append(all, tok) // PostgreSQL names the token once ($n+1 twice)
	}
	res, err := q.ExecContext(ctx, t.updateSQL(set, len(args)), all...)
	if err != nil {
		return fmt.Errorf("fence: update row %v of %s: %w", key, t.Name, err)
	}
	if changed, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("fence: update row %v of %s: %w", key, t.Name, err)
	} else if changed > 0 {
		return nil
	}
	held, done, err := t.whyUnchanged(ctx, q, s, key, token)
	if err != nil || done {
		return err // refused, or on MySQL the row matched and the write changed no value
	}
	return fmt.Errorf("fence: update row %v of %s: the row's fence is %d, not above token %d, but the update changed nothing", key, t.Name, held, token)
}

// updateSQL is Update's statement for set with n placeholders of its own.
func (t Table) updateSQL(set string, n int) string {
	d := t.Dialect
	tokenAgain := d.ph(n + 3)
	if d == PostgreSQL {
		tokenAgain = d.ph(n + 1)
	}
	return fmt.Sprintf("UPDATE %s SET %s, %s = %s WHERE %s = %s AND %s <= %s", d.quote(t.Name), set,
		d.quote(t.fenceColumn()), d.ph(n+1), d.quote(t.KeyColumn), d.ph(n+2), d.quote(t.fenceColumn()), tokenAgain)
}
