//go:build linux

package fencetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
)

// database is one kind of SQL server under test.
type database struct {
	name    string
	dialect fence.Dialect
	open    func(testing.TB) *sql.DB
	schema  string
}

var databases = []database{
	{"PostgreSQL", fence.PostgreSQL, postgresDB, `CREATE TABLE stock (
		sku   TEXT PRIMARY KEY,
		qty   BIGINT NOT NULL DEFAULT 0,
		note  TEXT NOT NULL DEFAULT '',
		fence BIGINT NOT NULL DEFAULT 0)`},
	{"MariaDB", fence.MySQL, mariaDB, `CREATE TABLE stock (
		sku   VARCHAR(64) PRIMARY KEY,
		qty   BIGINT NOT NULL DEFAULT 0,
		note  VARCHAR(200) NOT NULL DEFAULT '',
		fence BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB`},
	{"SQLite", fence.SQLite, sqliteDB, `CREATE TABLE stock (
		sku   TEXT PRIMARY KEY,
		qty   INTEGER NOT NULL DEFAULT 0,
		note  TEXT NOT NULL DEFAULT '',
		fence INTEGER NOT NULL DEFAULT 0)`},
}

// each runs f once per database, on a fresh database with the stock table.
func each(t *testing.T, f func(t *testing.T, d database, db *sql.DB, tbl fence.Table)) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := db.ExecContext(ctx, d.schema); err != nil {
				t.Fatalf("create table: %v", err)
			}
			f(t, d, db, fence.Table{Dialect: d.dialect, Name: "stock", KeyColumn: "sku", FenceColumn: "fence"})
		})
	}
}

func row(t testing.TB, db *sql.DB, sku string) (qty int64, note string, fenceAt int64) {
	t.Helper()
	if err := db.QueryRow("SELECT qty, note, fence FROM stock WHERE sku = '"+sku+"'").Scan(&qty, &note, &fenceAt); err != nil {
		t.Fatalf("read row %s: %v", sku, err)
	}
	return qty, note, fenceAt
}

// wantStale checks that err is a refusal naming the row's newer token.
func wantStale(t testing.TB, what string, err error, token, held uint64) {
	t.Helper()
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Token != token || se.Held != held {
		t.Fatalf("%s: %v; want ErrStale naming token %d over %d", what, err, held, token)
	}
	if !strings.Contains(err.Error(), fmt.Sprint(held)) {
		t.Fatalf("%s: the message %q does not name the newer token %d", what, err, held)
	}
}

// set writes qty in one fenced transaction, claiming the row first.
func set(ctx context.Context, db *sql.DB, tbl fence.Table, sku string, token uint64, qty int64) error {
	return fence.InTx(ctx, db, fence.Held(ctx, token), tbl, []string{sku}, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, update(tbl.Dialect), qty, sku)
		return err
	})
}

func update(d fence.Dialect) string {
	if d == fence.PostgreSQL {
		return "UPDATE stock SET qty = $1 WHERE sku = $2"
	}
	return "UPDATE stock SET qty = ? WHERE sku = ?"
}

func selectQty(d fence.Dialect) string {
	if d == fence.PostgreSQL {
		return "SELECT qty FROM stock WHERE sku = $1"
	}
	return "SELECT qty FROM stock WHERE sku = ?"
}

// TestPausedHolder: holder A (token 10) writes and commits, then pauses; holder B (token 11)
// takes over and writes; A resumes and every write it tries with token 10 is refused with
// ErrStale naming 11, while B's row stays as B left it. Equal tokens (B again) pass.
func TestPausedHolder(t *testing.T) {
	each(t, func(t *testing.T, d database, db *sql.DB, tbl fence.Table) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Upsert creates the row, then A sets it.
		if err := tbl.Upsert(ctx, db, "sku-7", 10, map[string]any{"qty": 5, "note": "seeded by A"}); err != nil {
			t.Fatalf("upsert that creates the row: %v", err)
		}
		if err := set(ctx, db, tbl, "sku-7", 10, 4); err != nil {
			t.Fatalf("A's write: %v", err)
		}
		// A pauses. B (token 11) claims and writes.
		if err := set(ctx, db, tbl, "sku-7", 11, 100); err != nil {
			t.Fatalf("B's write: %v", err)
		}
		// A resumes: its claim, its upsert and its whole transaction are refused.
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantStale(t, "A's claim", tbl.Claim(ctx, tx, "sku-7", 10), 10, 11)
		tx.Rollback()
		wantStale(t, "A's upsert", tbl.Upsert(ctx, db, "sku-7", 10, map[string]any{"qty": 3}), 10, 11)
		ran := false
		err = fence.InTx(ctx, db, fence.Held(ctx, 10), tbl, []string{"sku-7"}, func(context.Context, *sql.Tx) error { ran = true; return nil })
		wantStale(t, "A's InTx", err, 10, 11)
		if ran {
			t.Fatal("InTx ran fn after a refused claim")
		}
		if qty, _, f := row(t, db, "sku-7"); qty != 100 || f != 11 {
			t.Fatalf("row after A's late writes: qty %d fence %d; want B's 100 at 11", qty, f)
		}

		// Re-entry: B claims twice in one transaction, and again in another; B's upsert with
		// the same token writes, including one that changes no value.
		tx, err = db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := tbl.Claim(ctx, tx, "sku-7", 11); err != nil {
				t.Fatalf("B's claim #%d with its own token: %v", i+1, err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := set(ctx, db, tbl, "sku-7", 11, 99); err != nil {
			t.Fatalf("B's second transaction: %v", err)
		}
		for i := 0; i < 2; i++ { // the second changes nothing (MySQL then counts no affected row)
			if err := tbl.Upsert(ctx, db, "sku-7", 11, map[string]any{"qty": 98, "note": "B"}); err != nil {
				t.Fatalf("B's upsert #%d with its own token: %v", i+1, err)
			}
		}
		if qty, note, f := row(t, db, "sku-7"); qty != 98 || note != "B" || f != 11 {
			t.Fatalf("row after B's upserts: %d %q at %d; want 98 \"B\" at 11", qty, note, f)
		}
		// A newer token's upsert with no values only moves the fence.
		if err := tbl.Upsert(ctx, db, "sku-7", 12, nil); err != nil {
			t.Fatal(err)
		}
		if qty, _, f := row(t, db, "sku-7"); qty != 98 || f != 12 {
			t.Fatalf("row after an upsert of no values: qty %d fence %d; want 98 at 12", qty, f)
		}

		// A missing row.
		tx, err = db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := tbl.Claim(ctx, tx, "nope", 50); !errors.Is(err, fence.ErrNoRow) || errors.Is(err, fence.ErrStale) {
			t.Fatalf("claim of a missing row: %v, want ErrNoRow", err)
		}
		tx.Rollback()
		if err := fence.InTx(ctx, db, fence.Held(ctx, 50), tbl, []string{"nope"}, func(context.Context, *sql.Tx) error { return nil }); !errors.Is(err, fence.ErrNoRow) {
			t.Fatalf("InTx on a missing row: %v, want ErrNoRow", err)
		}
		// Tokens up to 2^53 and beyond fit the 64-bit column.
		big := uint64(1)<<53 + 1
		if err := tbl.Upsert(ctx, db, "big", big, map[string]any{"qty": 1}); err != nil {
			t.Fatal(err)
		}
		wantStale(t, "upsert below a large token", tbl.Upsert(ctx, db, "big", big-1, map[string]any{"qty": 2}), big-1, big)
	})
}

// TestRealLeaseLost: two dlock clients on a real redis-server. A's lease (WithoutRenewal, a
// short TTL) writes, then runs out; B locks the same name, gets a larger token and writes.
// A's late transaction on its lease fails before touching the row (ErrLeaseEnded, with
// dlock.ErrLost); a late write detached from the lease, as a holder paused after checking its
// lease would send, is refused by the fence, naming B's token.
func TestRealLeaseLost(t *testing.T) {
	url := startRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clientA, err := dlock.Dial(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer clientA.Close()
	clientB, err := dlock.Dial(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer clientB.Close()

	each(t, func(t *testing.T, d database, db *sql.DB, tbl fence.Table) {
		name := "stock:sku-1:" + d.name
		a, err := clientA.Mutex(name, dlock.WithTTL(300*time.Millisecond), dlock.WithoutRenewal()).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tbl.Upsert(ctx, db, "sku-1", a.Token(), map[string]any{"qty": 10}); err != nil {
			t.Fatal(err)
		}
		if err := fence.InTx(ctx, db, a, tbl, []string{"sku-1"}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, update(d.dialect), 9, "sku-1")
			return err
		}); err != nil {
			t.Fatalf("A's write under its live lease: %v", err)
		}
		// A "pauses" past its lease.
		select {
		case <-a.Context().Done():
		case <-time.After(30 * time.Second):
			t.Fatal("A's 300 ms lease still live after 30 s")
		}
		b, err := clientB.Mutex(name, dlock.WithTTL(10*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Unlock(context.Background())
		if b.Token() <= a.Token() {
			t.Fatalf("B's token %d not above A's %d", b.Token(), a.Token())
		}
		if err := fence.InTx(ctx, db, b, tbl, []string{"sku-1"}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, update(d.dialect), 50, "sku-1")
			return err
		}); err != nil {
			t.Fatalf("B's write: %v", err)
		}

		ran := false
		err = fence.InTx(ctx, db, a, tbl, []string{"sku-1"}, func(context.Context, *sql.Tx) error { ran = true; return nil })
		if !errors.Is(err, fence.ErrLeaseEnded) || !errors.Is(err, dlock.ErrLost) || ran {
			t.Fatalf("A's transaction on its lost lease: %v (fn ran: %v); want ErrLeaseEnded and dlock.ErrLost, fn not run", err, ran)
		}
		detached := fence.Held(context.WithoutCancel(a.Context()), a.Token())
		err = fence.InTx(ctx, db, detached, tbl, []string{"sku-1"}, func(ctx context.Context, tx *sql.Tx) error {
			ran = true
			_, err := tx.ExecContext(ctx, update(d.dialect), 1, "sku-1")
			return err
		})
		wantStale(t, "A's detached late write", err, a.Token(), b.Token())
		wantStale(t, "A's late upsert", tbl.Upsert(ctx, db, "sku-1", a.Token(), map[string]any{"qty": 2}), a.Token(), b.Token())
		if qty, _, f := row(t, db, "sku-1"); ran || qty != 50 || uint64(f) != b.Token() {
			t.Fatalf("row: qty %d fence %d (A's fn ran: %v); want B's 50 at %d", qty, f, ran, b.Token())
		}
	})
}

// TestNoLostUpdate: goroutines increment a counter row, each in one fenced read-modify-write
// transaction under its own token, handed out in increasing order as a lock service would.
// Some start at once and race; some wait until a newer token has committed and so are
// certainly stale. The final count is exactly the number of accepted transactions, every
// certainly-stale one is refused, and the row's fence is the largest accepted token.
func TestNoLostUpdate(t *testing.T) {
	each(t, func(t *testing.T, d database, db *sql.DB, tbl fence.Table) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := tbl.Upsert(ctx, db, "counter", 1, map[string]any{"qty": 0}); err != nil {
			t.Fatal(err)
		}
		const workers, each = 8, 25
		var (
			next      atomic.Uint64 // the last token handed out
			committed atomic.Uint64 // the largest accepted token
			accepted  atomic.Int64
			refused   atomic.Int64
			running   atomic.Int64 // workers not done
			wg        sync.WaitGroup
			errs      = make(chan error, workers)
		)
		next.Store(1)
		running.Store(workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer running.Add(-1)
				for i := 0; i < each; i++ {
					token := next.Add(1)
					late := (w+i)%4 == 0
					if late { // pause until a newer holder has committed
						deadline := time.Now().Add(30 * time.Second)
						for committed.Load() <= token && running.Load() > 1 && time.Now().Before(deadline) {
							time.Sleep(time.Millisecond)
						}
						if committed.Load() <= token {
							late = false // nobody newer came (the end of the run): not certainly stale
						}
					}
					err := fence.InTx(ctx, db, fence.Held(ctx, token), tbl, []string{"counter"}, func(ctx context.Context, tx *sql.Tx) error {
						var n int64
						if err := tx.QueryRowContext(ctx, selectQty(d.dialect), "counter").Scan(&n); err != nil {
							return err
						}
						_, err := tx.ExecContext(ctx, update(d.dialect), n+1, "counter")
						return err
					})
					switch {
					case err == nil:
						if late {
							errs <- fmt.Errorf("token %d accepted after a newer one committed", token)
							return
						}
						accepted.Add(1)
						for {
							c := committed.Load()
							if c >= token || committed.CompareAndSwap(c, token) {
								break
							}
						}
					case errors.Is(err, fence.ErrStale):
						refused.Add(1)
					default:
						errs <- fmt.Errorf("token %d: %w", token, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		qty, _, f := row(t, db, "counter")
		t.Logf("%d accepted, %d refused as stale", accepted.Load(), refused.Load())
		if qty != accepted.Load() {
			t.Fatalf("counter %d after %d accepted increments: updates lost", qty, accepted.Load())
		}
		if uint64(f) != committed.Load() {
			t.Fatalf("fence %d, want the largest accepted token %d", f, committed.Load())
		}
		if accepted.Load() == 0 || refused.Load() == 0 {
			t.Fatalf("%d accepted, %d refused: want both", accepted.Load(), refused.Load())
		}
	})
}

// TestReadIsFenced: the read of a read-modify-write is fenced. Old holder A (token 1) claims
// the row and reads qty 100; new holder B (token 2) starts its own claim-read-write. B's claim
// waits for A's transaction (on PostgreSQL and MariaDB the test sees B waiting on A's row lock
// in the server); A writes 99 and commits; only then does B read, so it reads 99 and writes
// 98. Were rows claimed only at write time (or the claim took no lock), B would read 100
// while A was between its read and write, and write 99 over A's 99: one sale lost.
func TestReadIsFenced(t *testing.T) {
	each(t, func(t *testing.T, d database, db *sql.DB, tbl fence.Table) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := tbl.Upsert(ctx, db, "w", 1, map[string]any{"qty": 100}); err != nil {
			t.Fatal(err)
		}
		txA, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer txA.Rollback()
		if err := tbl.Claim(ctx, txA, "w", 1); err != nil {
			t.Fatal(err)
		}
		var readA int64
		if err := txA.QueryRowContext(ctx, selectQty(d.dialect), "w").Scan(&readA); err != nil || readA != 100 {
			t.Fatalf("A's read: %d, %v", readA, err)
		}

		readB := make(chan int64, 1)
		doneB := make(chan error, 1)
		go func() {
			doneB <- fence.InTx(ctx, db, fence.Held(ctx, 2), tbl, []string{"w"}, func(ctx context.Context, tx *sql.Tx) error {
				var n int64
				if err := tx.QueryRowContext(ctx, selectQty(d.dialect), "w").Scan(&n); err != nil {
					return err
				}
				readB <- n
				_, err := tx.ExecContext(ctx, update(d.dialect), n-1, "w")
				return err
			})
		}()
		waitBlocked(t, d, db, readB)
		select {
		case n := <-readB:
			t.Fatalf("B read qty %d while A held its claim", n)
		default:
		}
		if _, err := txA.ExecContext(ctx, update(d.dialect), readA-1, "w"); err != nil {
			t.Fatal(err)
		}
		if err := txA.Commit(); err != nil {
			t.Fatalf("A's commit: %v", err)
		}
		if err := <-doneB; err != nil {
			t.Fatalf("B: %v", err)
		}
		if n := <-readB; n != 99 {
			t.Fatalf("B read %d, want A's committed 99", n)
		}
		if qty, _, f := row(t, db, "w"); qty != 98 || f != 2 {
			t.Fatalf("row: qty %d fence %d; want 98 at 2 (no update lost)", qty, f)
		}
	})
}

// waitBlocked returns once B is seen waiting for A's lock: in PostgreSQL's view of lock waits,
// or in MariaDB's process list as running its claim; for SQLite, whose writer waits in its busy handler out of sight, once
// B has not read within 300 ms (B reading at all before A commits fails the test).
func waitBlocked(t *testing.T, d database, db *sql.DB, readB chan int64) {
	t.Helper()
	var q string
	switch d.dialect {
	case fence.PostgreSQL:
		q = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
	case fence.MySQL:
		// B's claim in progress (A's connection is idle between statements). MariaDB's
		// INNODB_TRX does not always list a transaction waiting in its first statement.
		q = "SELECT count(*) FROM information_schema.PROCESSLIST WHERE info LIKE 'UPDATE `stock` SET `fence`%' AND id <> CONNECTION_ID()"
	default:
		select {
		case n := <-readB:
			t.Fatalf("B read qty %d while A held its claim", n)
		case <-time.After(300 * time.Millisecond):
		}
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.QueryRow(q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case n := <-readB:
			t.Fatalf("B read qty %d while A held its claim", n)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("B not seen waiting for A's row lock within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMariaDBRepeatableReadSeesLatest: under InnoDB's REPEATABLE READ (the default), a plain
// SELECT reads the snapshot taken at the transaction's first plain read. Even when that
// snapshot is older than the last commit to the row, a SELECT after the claim sees the latest
// committed row: the claim is a locking read of the latest version, and the row it writes is
// the transaction's own, which its reads always see.
func TestMariaDBRepeatableReadSeesLatest(t *testing.T) {
	db := mariaDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.ExecContext(ctx, databases[1].schema); err != nil {
		t.Fatal(err)
	}
	tbl := fence.Table{Dialect: fence.MySQL, Name: "stock", KeyColumn: "sku"}
	for _, sku := range []string{"w", "other"} {
		if err := tbl.Upsert(ctx, db, sku, 1, map[string]any{"qty": 100}); err != nil {
			t.Fatal(err)
		}
	}
	var iso string
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tx.QueryRowContext(ctx, "SELECT @@tx_isolation").Scan(&iso); err != nil || iso != "REPEATABLE-READ" {
		t.Fatalf("isolation %q, %v; want the default REPEATABLE-READ", iso, err)
	}
	var n int64
	// The snapshot: taken here, before the other holder's commit below.
	if err := tx.QueryRowContext(ctx, "SELECT qty FROM stock WHERE sku = 'w'").Scan(&n); err != nil || n != 100 {
		t.Fatalf("first read: %d, %v", n, err)
	}
	if err := set(ctx, db, tbl, "w", 5, 42); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, "SELECT qty FROM stock WHERE sku = 'w'").Scan(&n); err != nil || n != 100 {
		t.Fatalf("read from the snapshot before the claim: %d, %v; want the snapshot's 100", n, err)
	}
	if err := tbl.Claim(ctx, tx, "w", 6); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, "SELECT qty FROM stock WHERE sku = 'w'").Scan(&n); err != nil || n != 42 {
		t.Fatalf("plain read after the claim: %d, %v; want the latest committed 42", n, err)
	}
}

// TestPostgresRepeatableRead: under PostgreSQL's REPEATABLE READ (and SERIALIZABLE) a claim
// that waited for another transaction's claim of the row fails with a serialization failure
// (SQLSTATE 40001) once that transaction commits: safe (nothing is written), but the caller
// must retry the whole transaction. READ COMMITTED, the default, waits and goes on.
func TestPostgresRepeatableRead(t *testing.T) {
	db := postgresDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.ExecContext(ctx, databases[0].schema); err != nil {
		t.Fatal(err)
	}
	tbl := fence.Table{Dialect: fence.PostgreSQL, Name: "stock", KeyColumn: "sku"}
	if err := tbl.Upsert(ctx, db, "w", 1, map[string]any{"qty": 100}); err != nil {
		t.Fatal(err)
	}
	txA, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback()
	if err := tbl.Claim(ctx, txA, "w", 2); err != nil {
		t.Fatal(err)
	}
	txB, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer txB.Rollback()
	claimB := make(chan error, 1)
	go func() { claimB <- tbl.Claim(ctx, txB, "w", 3) }()
	waitBlocked(t, databases[0], db, nil)
	if _, err := txA.ExecContext(ctx, "UPDATE stock SET qty = 99 WHERE sku = 'w'"); err != nil {
		t.Fatal(err)
	}
	if err := txA.Commit(); err != nil {
		t.Fatal(err)
	}
	err = <-claimB
	if err == nil || !strings.Contains(err.Error(), "40001") {
		t.Fatalf("claim under REPEATABLE READ after a concurrent commit: %v; want a serialization failure (40001)", err)
	}
	if qty, _, f := row(t, db, "w"); qty != 99 || f != 2 {
		t.Fatalf("row: %d at %d; want A's 99 at 2", qty, f)
	}
}

// Update: a fenced write in one statement. A newer token writes and moves the fence; an older
// one is refused naming the newer and writes nothing; the same token again passes (also when it
// changes no value, which MySQL reports as no row changed); a missing row is ErrNoRow.
func TestUpdate(t *testing.T) {
	each(t, func(t *testing.T, d database, db *sql.DB, tbl fence.Table) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ph := "?"
		if d.dialect == fence.PostgreSQL {
			ph = "$1"
		}
		if err := tbl.Upsert(ctx, db, "sku-9", 10, map[string]any{"qty": 5}); err != nil {
			t.Fatal(err)
		}
		if err := tbl.Update(ctx, db, "sku-9", 11, "qty = qty - "+ph, 2); err != nil {
			t.Fatalf("newer holder's update: %v", err)
		}
		if qty, _, f := row(t, db, "sku-9"); qty != 3 || f != 11 {
			t.Fatalf("row after the update: qty %d fence %d; want 3 at 11", qty, f)
		}
		wantStale(t, "the older holder's late update", tbl.Update(ctx, db, "sku-9", 10, "qty = qty - "+ph, 1), 10, 11)
		if err := tbl.Update(ctx, db, "sku-9", 11, "qty = qty - "+ph, 0); err != nil {
			t.Fatalf("the same holder again, changing nothing: %v", err)
		}
		if qty, _, f := row(t, db, "sku-9"); qty != 3 || f != 11 {
			t.Fatalf("row after the refused and the empty update: qty %d fence %d; want 3 at 11", qty, f)
		}
		if err := tbl.Update(ctx, db, "no-such-sku", 12, "qty = qty - "+ph, 1); !errors.Is(err, fence.ErrNoRow) {
			t.Fatalf("update of a missing row = %v, want ErrNoRow", err)
		}
	})
}
