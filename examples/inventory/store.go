package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/dlock-go/dlock/fence"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite", pure Go
)

var (
	// errSoldOut: the row has less stock than asked for.
	errSoldOut = errors.New("sold out")
	// errUnknownSKU: no row for the SKU.
	errUnknownSKU = errors.New("unknown sku")
	// errStale: the row has already been claimed under a larger fencing token, so the caller's
	// lock is no longer the newest one on this SKU: its read and write were refused.
	errStale = fence.ErrStale
)

// store keeps the stock rows. Every purchase runs in one transaction fenced by the token of the
// dlock lease on the SKU.
type store struct {
	db    *sql.DB
	kind  string      // "sqlite" or "postgres"
	table fence.Table // the stock rows, fenced by their fence column
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
	s.table = fence.Table{Dialect: fence.SQLite, Name: "stock", KeyColumn: "sku", FenceColumn: "fence"}
	if s.kind == "postgres" {
		s.table.Dialect = fence.PostgreSQL
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

// Buy takes n items of sku, as the holder of the lock whose fencing token is token, in one
// transaction that fence.InTx runs inside the lease (ctx, the lease context: when the lock is
// lost, the transaction is rolled back):
//
//  1. Claim the row (fence.Table.Claim): its fence moves forward to token, and the row stays
//     locked until the transaction ends. A newer token on the row → errStale (a
//     *fence.StaleError naming it): nothing is read and nothing is written. An equal token is
//     this very lease, which may run several transactions.
//  2. Read qty: after the claim, so the read is fenced too.
//  3. Write qty - n, or, when there are fewer than n, keep the claim (the fence only moves
//     forward) and report the stock as it is (errSoldOut).
func (s *store) Buy(ctx context.Context, sku string, n int, token uint64) (left int, err error) {
	soldOut := false
	err = fence.InTx(ctx, s.db, fence.Held(ctx, token), s.table, []string{sku}, func(ctx context.Context, tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SELECT qty FROM stock WHERE sku = $1`, sku).Scan(&left); err != nil {
			return fmt.Errorf("read stock: %w", err)
		}
		if soldOut = left < n; soldOut {
			return nil
		}
		left -= n
		if _, err := tx.ExecContext(ctx, `UPDATE stock SET qty = $2 WHERE sku = $1`, sku, left); err != nil {
			return fmt.Errorf("write stock: %w", err)
		}
		return nil
	})
	switch {
	case errors.Is(err, fence.ErrNoRow):
		return 0, errUnknownSKU
	case err != nil:
		return 0, err
	case soldOut:
		return left, errSoldOut
	}
	return left, nil
}

// Seed sets the stock of sku to qty, creating the row if needed, as the holder of the lock
// with the given token; a row already fenced by a newer token is left alone (errStale).
func (s *store) Seed(ctx context.Context, sku string, qty int, token uint64) error {
	return s.table.Upsert(ctx, s.db, sku, token, map[string]any{"qty": qty})
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
