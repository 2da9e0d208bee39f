// Package fence makes SQL rows check a lock's fencing token, so that a holder paused past its
// lease (a GC pause, a stopped VM, a slow network) cannot write over the work of the holder
// that came after it.
//
// A dlock lease's Token is larger than the token of every earlier acquisition of its name. A
// fenced row keeps, in a fence column, the largest token that has claimed it, and refuses a
// smaller one. Standard library only (database/sql); bring your own driver.
//
//	t := fence.Table{Dialect: fence.PostgreSQL, Name: "stock", KeyColumn: "sku", FenceColumn: "fence"}
//	err := fence.InTx(ctx, db, lease, t, []string{"sku-7"}, func(ctx context.Context, tx *sql.Tx) error {
//		var qty int
//		if err := tx.QueryRowContext(ctx, "SELECT qty FROM stock WHERE sku = $1", "sku-7").Scan(&qty); err != nil {
//			return err
//		}
//		_, err := tx.ExecContext(ctx, "UPDATE stock SET qty = $1 WHERE sku = $2", qty-1, "sku-7")
//		return err
//	})
//	// errors.Is(err, fence.ErrStale): a newer holder has the row; nothing was written.
//
// # What it guarantees
//
//   - Claim (UPDATE ... SET fence = token WHERE key = k AND fence <= token) succeeds only if no
//     larger token has claimed the row, and then locks the row until the transaction ends:
//     PostgreSQL and InnoDB take the row's write lock, SQLite holds the database's write lock.
//   - So every read and write of a claimed row later in the same transaction is fenced: a
//     newer holder's claim waits for this transaction to end and then sees what it committed,
//     and an older holder's claim is refused. Read-modify-write is safe when the claim comes
//     first: claim, then read, then write. (A read before the claim is not fenced: an older
//     holder could read a value, let a newer holder write, and write back.)
//   - Equal tokens pass: the same lease may claim a row again, in the same transaction or in
//     another one.
//   - A refused claim or upsert returns a *StaleError, matching ErrStale, naming the row's
//     token; a missing row, ErrNoRow. Neither writes anything; roll back, and do not retry with
//     the same token (the lock has moved on).
//   - Upsert is one fenced INSERT ... ON CONFLICT / ON DUPLICATE KEY UPDATE: it creates the
//     row, or sets its columns and fence if no larger token holds it.
//   - Update is one fenced UPDATE ... SET <yours>, fence = token WHERE key = k AND fence <=
//     token: a write that needs no read first (qty = qty - ?) costs what the unfenced
//     statement does. A write computed from a read needs Claim (or InTx) first.
//   - InTx runs its function in a transaction whose context is the lease's context, claims the
//     rows first in sorted order (no deadlock between two InTx calls on overlapping keys), and
//     commits only if the function returned nil and the lease is live just before COMMIT.
//
// A lease lost between that last check and COMMIT does not break this: the rows are still
// locked by the committing transaction, so a newer holder's claim waits for it (PostgreSQL:
// without limit unless lock_timeout is set; MySQL/MariaDB: up to innodb_lock_wait_timeout, 50 s
// by default, then error 1205; SQLite: up to the busy timeout, then SQLITE_BUSY) and builds on
// its result. An older holder's write can commit before a newer holder's claim, never after.
//
// # Isolation levels
//
// Tested at each database's default, where Claim then read works as above:
//
//   - PostgreSQL, READ COMMITTED (the default): a claim that waited for another transaction's
//     claim of the row re-checks the fence on the committed row and goes on; each later
//     statement sees the latest committed data. Under REPEATABLE READ or SERIALIZABLE the
//     guarantee holds too, but that waiting claim fails with a serialization failure (SQLSTATE
//     40001) once the other transaction commits: retry the whole transaction, with the same
//     token.
//   - MySQL/MariaDB InnoDB, REPEATABLE READ (the default): the claim is a locking read of the
//     latest committed row, and the row version it writes is the transaction's own, which its
//     plain SELECTs always see. So a plain SELECT after a claim that moved the fence sees the
//     latest committed row even if the transaction's snapshot was taken earlier (tested). A
//     re-entry claim (equal token) writes no new version; claim before the first read, as InTx
//     does, and nothing older can be in the snapshot. READ COMMITTED works as for PostgreSQL.
//     MariaDB's innodb_snapshot_isolation=ON (the default of recent releases; not tested here:
//     MariaDB 10.11 has it off) may instead refuse a claim of a row committed after the
//     snapshot (error 1020): retry the transaction.
//   - SQLite: transactions are serializable. Open the database with BEGIN IMMEDIATE
//     (modernc.org/sqlite: _txlock=immediate) and a busy timeout, so that a transaction takes
//     the write lock first and waits for it; a deferred transaction that reads before it
//     writes can fail with SQLITE_BUSY instead.
//
// # Schema
//
// The fence column is a 64-bit integer, 0 for a row never claimed. Tokens are below 2^53
// (about 1.8e15 for a lock created today) and are passed to the driver as int64:
//
//	PostgreSQL:    ALTER TABLE stock ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//	MySQL/MariaDB: ALTER TABLE stock ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//	SQLite:        ALTER TABLE stock ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
//
// KeyColumn must be the primary key or a unique, non-null column (Upsert's conflict target).
// MySQL tables must use InnoDB (row locks, transactions).
//
// # Dialects and names
//
// PostgreSQL uses $1 placeholders and "quoted" names; MySQL and MariaDB ? and `quoted` names
// (Upsert uses VALUES(), which MySQL 8 deprecates but still runs, and MariaDB needs); SQLite ?
// and "quoted" names. Table and column names must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$, a table
// optionally qualified by a schema (shop.stock); they are quoted, never spliced raw, so they
// are case-sensitive where the database says so. A bad name, a missing dialect or a token of
// 0 is an error matching ErrInvalid at first use.
//
// # Cost
//
// Update is one statement, as the same write unfenced (docs/BENCHMARKS.md, "Fenced SQL
// writes"). Claim is one statement per row when it moves the fence. Telling a refusal (ErrStale) from
// a missing row (ErrNoRow) costs a second one, and so does, on MySQL, a re-entry claim or an
// Upsert that inserts or changes no value: MySQL reports changed rows, not matched ones. InTx
// adds the claims to the caller's transaction: one extra round trip per row.
//
// # Leases
//
// InTx takes a Lease, any value with Token and Context: a *dlock.Lease, or Held(lctx, token)
// inside dlock's Do. The package does not import dlock, so it can fence any token source whose
// tokens only grow; a lost dlock lease's error still matches dlock.ErrLost, the lease
// context's cause, as well as ErrLeaseEnded.
package fence
