package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // database/sql driver "sqlite", pure Go

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Where the resource server keeps its register (a scenario's store). By default in its own
// memory, fenced by its own comparison of tokens; the store rows keep it where an application
// would, and fence it with the library's helpers: an SQLite row written through package fence,
// or a Redis key written through the Client's fenced operations. The resource server still
// takes every request under its mutex and stamps it, so the wire format, the record and the
// analysis are the same for every store: only who decides "stale" changes, and the final value
// is read back from the store itself.

// storeKind names a scenario's store.
type storeKind string

const (
	memoryStore storeKind = ""       // the resource server's own integer and fence
	sqliteStore storeKind = "sqlite" // a row of an SQLite file, fenced by package fence
	redisStore  storeKind = "redis"  // a key of its own redis-server, fenced by Client.FencedGet/FencedSet
)

// registerStore is a store of the register. Fenced, read and write pass the token to the
// store's fence and report accepted false when it refuses it as stale; unfenced, they read and
// write the value plainly (accepted is always true). err is anything else: the store failed.
type registerStore interface {
	read(ctx context.Context, fenced bool, token uint64) (v int64, accepted bool, err error)
	write(ctx context.Context, fenced bool, token uint64, v int64) (accepted bool, err error)
	final(ctx context.Context) (int64, error) // the register as the store holds it, read plainly
	close() error
}

// storeOpTimeout bounds one operation on a store.
const storeOpTimeout = 10 * time.Second

// registerKey is the register's key: the SQLite row's key, the Redis key.
const registerKey = "check-register"

// sqliteRegister is the register in a table of an SQLite file:
//
//	register(k TEXT PRIMARY KEY, v INTEGER, fence INTEGER)
//
// Fenced, a read is fence.Table.Claim then SELECT in one transaction (the claim takes the
// database's write lock first, so the read is fenced), and a write is one fence.Table.Update.
type sqliteRegister struct {
	db *sql.DB
	t  fence.Table
}

func openSQLiteRegister(dir string) (*sqliteRegister, error) {
	path := filepath.Join(dir, "register.db")
	// As package fence asks of SQLite: BEGIN IMMEDIATE and a busy timeout. WAL with
	// synchronous NORMAL spares a sync per commit: the file is the run's, not durable data.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("sqlite register: %w", err)
	}
	db.SetMaxOpenConns(1) // the resource server applies one request at a time
	ctx, cancel := context.WithTimeout(context.Background(), storeOpTimeout)
	defer cancel()
	for _, q := range []string{
		`CREATE TABLE register (k TEXT PRIMARY KEY, v INTEGER NOT NULL, fence INTEGER NOT NULL DEFAULT 0)`,
		`INSERT INTO register (k, v) VALUES ('` + registerKey + `', 0)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("sqlite register %s: %w", path, err)
		}
	}
	return &sqliteRegister{db: db, t: fence.Table{Dialect: fence.SQLite, Name: "register", KeyColumn: "k", FenceColumn: "fence"}}, nil
}

func (s *sqliteRegister) read(ctx context.Context, fenced bool, token uint64) (int64, bool, error) {
	if !fenced {
		v, err := s.final(ctx)
		return v, true, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: sql.ErrTxDone, ignored
	if err := s.t.Claim(ctx, tx, registerKey, token); errors.Is(err, fence.ErrStale) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, err
	}
	var v int64
	if err := tx.QueryRowContext(ctx, `SELECT v FROM register WHERE k = ?`, registerKey).Scan(&v); err != nil {
		return 0, false, err
	}
	return v, true, tx.Commit()
}

func (s *sqliteRegister) write(ctx context.Context, fenced bool, token uint64, v int64) (bool, error) {
	if !fenced {
		_, err := s.db.ExecContext(ctx, `UPDATE register SET v = ? WHERE k = ?`, v, registerKey)
		return err == nil, err
	}
	err := s.t.Update(ctx, s.db, registerKey, token, `v = ?`, v)
	if errors.Is(err, fence.ErrStale) {
		return false, nil
	}
	return err == nil, err
}

func (s *sqliteRegister) final(ctx context.Context) (int64, error) {
	var v int64
	err := s.db.QueryRowContext(ctx, `SELECT v FROM register WHERE k = ?`, registerKey).Scan(&v)
	return v, err
}

func (s *sqliteRegister) close() error { return s.db.Close() }

// redisRegister is the register in a string key of a redis-server of its own (the
// application's data, apart from the lock's server and its faults), as decimal text. Fenced,
// a read is Client.FencedGet and a write Client.FencedSet (no expiry), through a dlock Client
// of that server; unfenced, plain GET and SET.
type redisRegister struct {
	srv   *redistest.Server
	c     *dlock.Client
	plain *redis.Client
}

func openRedisRegister() (*redisRegister, error) {
	srv, err := redistest.StartProcess()
	if err != nil {
		return nil, fmt.Errorf("redis register: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeOpTimeout)
	defer cancel()
	c, err := dlock.Dial(ctx, srv.URL())
	if err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("redis register: %w", err)
	}
	r := &redisRegister{srv: srv, c: c, plain: redis.NewClient(&redis.Options{Addr: srv.Addr})}
	if err := r.plain.Set(ctx, registerKey, "0", 0).Err(); err != nil {
		_ = r.close()
		return nil, fmt.Errorf("redis register: %w", err)
	}
	return r, nil
}

func (r *redisRegister) read(ctx context.Context, fenced bool, token uint64) (int64, bool, error) {
	if !fenced {
		v, err := r.final(ctx)
		return v, true, err
	}
	s, ok, err := r.c.FencedGet(ctx, registerKey, token)
	switch {
	case errors.Is(err, dlock.ErrStale):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	case !ok:
		return 0, false, fmt.Errorf("redis register: key %s is gone", registerKey)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil, err
}

func (r *redisRegister) write(ctx context.Context, fenced bool, token uint64, v int64) (bool, error) {
	val := strconv.FormatInt(v, 10)
	if !fenced {
		err := r.plain.Set(ctx, registerKey, val, 0).Err()
		return err == nil, err
	}
	err := r.c.FencedSet(ctx, registerKey, val, token, 0)
	if errors.Is(err, dlock.ErrStale) {
		return false, nil
	}
	return err == nil, err
}

func (r *redisRegister) final(ctx context.Context) (int64, error) {
	return r.plain.Get(ctx, registerKey).Int64()
}

func (r *redisRegister) close() error {
	return errors.Join(r.c.Close(), r.plain.Close(), r.srv.Close())
}

// openStore opens a store of kind k, its files (if any) in dir; nil for the memory store.
func openStore(k storeKind, dir string) (registerStore, error) {
	switch k {
	case memoryStore:
		return nil, nil
	case sqliteStore:
		s, err := openSQLiteRegister(dir)
		if err != nil {
			return nil, err // not a nil *sqliteRegister in the interface
		}
		return s, nil
	case redisStore:
		r, err := openRedisRegister()
		if err != nil {
			return nil, err
		}
		return r, nil
	}
	return nil, fmt.Errorf("unknown register store %q", k)
}
