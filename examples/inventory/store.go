package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite", pure Go
)

var (
	// errSoldOut: the row has less stock than asked for.
	errSoldOut = errors.New("sold out")
	// errUnknownSKU: no row for the SKU.
	errUnknownSKU = errors.New("unknown sku")
	// errStale: the row has already been touched under a larger fencing token, so the caller's
	// lock is no longer the newest one on this SKU: its read and write were refused.
	errStale = errors.New("stale fencing token: a newer lock holder has written this row")
)

// store keeps the stock rows. Every purchase runs in one transaction fenced by the token of the
// dlock lease on the SKU.
type store struct {
	db   *sql.DB
	kind string // "sqlite" or "postgres"
}

const schema = `CREATE TABLE IF NOT EXISTS stock (
	sku   TEXT PRIMARY KEY,
	qty   INTEGER NOT NULL,
	fence BIGINT NOT NULL DEFAULT 0
)`

// openStore opens dsn: a postgres:// or postgresql:// URL uses PostgreSQL (pgx), anything else
// is the path of an SQLite file (created when missing).
func openStore(ctx context.Context, dsn string) (*store, error) {
	s := &store{kind: "sqlite"}
	var err error
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		s.kind = "postgres"
		s.db, err = sql.Open("pgx", dsn)
		if err == nil {
			s.db.SetMaxOpenConns(16)
			s.db.SetMaxIdleConns(16)
		}
	} else {
		s.db, err = sql.Open("sqlite", sqliteDSN(dsn))
		if err == nil {
			// One writer at a time per file anyway; a few connections serve concurrent reads.
			s.db.SetMaxOpenConns(4)
			s.db.SetMaxIdleConns(4)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", s.kind, err)
	}
	if err := s.db.PingContext(ctx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("connect to %s: %w", s.kind, err)
	}
	if _, err := s.db.ExecContext(ctx, schema); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("create table: %w", err)
	}
	return s, nil
}

// sqliteDSN turns a file path into a modernc.org/sqlite DSN for several processes sharing the
// file: WAL (readers do not block the writer), a busy timeout (a writer waits for the file's
// write lock instead of failing with SQLITE_BUSY), and BEGIN IMMEDIATE (a transaction takes the
// write lock when it starts, so it never has to upgrade a read lock, which could fail at once).
func sqliteDSN(path string) string {
	path = strings.TrimPrefix(path, "sqlite://")
	path = strings.TrimPrefix(path, "file:")
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

func (s *store) Close() error { return s.db.Close() }

func fenceArg(token uint64) (int64, error) {
	if token == 0 || token > math.MaxInt64 {
		return 0, fmt.Errorf("fencing token %d out of range", token)
	}
	return int64(token), nil
}

// Buy takes n items of sku, as the holder of the lock whose fencing token is token.
//
//  1. Claim the row: UPDATE stock SET fence = token WHERE sku = $1 AND fence <= token.
//     No row changed → either the SKU is unknown or the row was already claimed by a newer
//     holder (errStale): nothing is read and nothing is written. (<=, not <: tokens are unique
//     per acquisition, so an equal fence is this very lease, which may run several
//     transactions.)
//  2. Read qty (in the same transaction, after the claim: the read is fenced too).
//  3. Write qty - n WHERE sku = $1 AND fence = token: the row must still be ours.
//  4. Commit.
//
// ctx should be the lease context: when the lock is lost, the transaction is rolled back.
func (s *store) Buy(ctx context.Context, sku string, n int, token uint64) (left int, err error) {
	fence, err := fenceArg(token)
	if err != nil {
		return 0, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	res, err := tx.ExecContext(ctx, `UPDATE stock SET fence = $2 WHERE sku = $1 AND fence <= $2`, sku, fence)
	if err != nil {
		return 0, fmt.Errorf("claim row: %w", err)
	}
	if claimed, err := res.RowsAffected(); err != nil {
		return 0, err
	} else if claimed != 1 {
		return 0, s.whyNot(ctx, tx, sku)
	}
	var qty int
	if err := tx.QueryRowContext(ctx, `SELECT qty FROM stock WHERE sku = $1`, sku).Scan(&qty); err != nil {
		return 0, fmt.Errorf("read stock: %w", err)
	}
	if qty < n {
		// Keep the claim (the fence only moves forward) and report the stock as it is.
		if err := tx.Commit(); err != nil {
			return 0, fmt.Errorf("commit: %w", err)
		}
		return qty, errSoldOut
	}
	res, err = tx.ExecContext(ctx, `UPDATE stock SET qty = $2 WHERE sku = $1 AND fence = $3`, sku, qty-n, fence)
	if err != nil {
		return 0, fmt.Errorf("write stock: %w", err)
	}
	if written, err := res.RowsAffected(); err != nil {
		return 0, err
	} else if written != 1 {
		return 0, errStale
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return qty - n, nil
}

// whyNot explains a claim that changed no row: the row is missing, or fenced by a newer token.
func (s *store) whyNot(ctx context.Context, tx *sql.Tx, sku string) error {
	var fence int64
	err := tx.QueryRowContext(ctx, `SELECT fence FROM stock WHERE sku = $1`, sku).Scan(&fence)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return errUnknownSKU
	case err != nil:
		return fmt.Errorf("read fence: %w", err)
	}
	return fmt.Errorf("%w (row fenced at %d)", errStale, fence)
}

// Seed sets the stock of sku to qty, creating the row if needed, as the holder of the lock
// with the given token; a row already fenced by a newer token is left alone (errStale).
func (s *store) Seed(ctx context.Context, sku string, qty int, token uint64) error {
	fence, err := fenceArg(token)
	if err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, `INSERT INTO stock (sku, qty, fence) VALUES ($1, $2, $3)
		ON CONFLICT (sku) DO UPDATE SET qty = excluded.qty, fence = excluded.fence
		WHERE stock.fence <= excluded.fence`, sku, qty, fence)
	if err != nil {
		return fmt.Errorf("seed %s: %w", sku, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n != 1 {
		return errStale
	}
	return nil
}

// SeedIfAbsent creates the row for sku with qty items unless it exists; it needs no lock.
func (s *store) SeedIfAbsent(ctx context.Context, sku string, qty int) (created bool, err error) {
	res, err := s.db.ExecContext(ctx, `INSERT INTO stock (sku, qty, fence) VALUES ($1, $2, 0)
		ON CONFLICT (sku) DO NOTHING`, sku, qty)
	if err != nil {
		return false, fmt.Errorf("seed %s: %w", sku, err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// Stock returns the committed quantity and fence of sku.
func (s *store) Stock(ctx context.Context, sku string) (qty int, fence int64, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT qty, fence FROM stock WHERE sku = $1`, sku).Scan(&qty, &fence)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, errUnknownSKU
	}
	return qty, fence, err
}

// StockRow is one SKU's committed quantity and fence.
type StockRow struct {
	SKU   string `json:"sku"`
	Qty   int    `json:"qty"`
	Fence int64  `json:"fence"`
}

// Report reads every SKU's committed stock: a whole-table read, the kind of query a service
// bounds across its replicas (GET /report runs it under a semaphore).
func (s *store) Report(ctx context.Context) ([]StockRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT sku, qty, fence FROM stock ORDER BY sku`)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	defer rows.Close()
	var out []StockRow
	for rows.Next() {
		var r StockRow
		if err := rows.Scan(&r.SKU, &r.Qty, &r.Fence); err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
