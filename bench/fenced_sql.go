package main

// The cost of fencing a SQL write (go run . --fenced-sql): one transaction that claims its row
// under a fresh token with fence.InTx and then updates it, beside the same update in a plain
// transaction, on PostgreSQL, MariaDB and SQLite. The servers are private (PostgreSQL on a
// loopback port, MariaDB on a unix socket) and started here; a database whose server is not
// installed is skipped with a note. Not part of the default run: it needs those servers.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/fence"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"
)

const fencedSQLWorkers = 16

// sqlTarget is one database to measure.
type sqlTarget struct {
	name    string
	dialect fence.Dialect
	db      *sql.DB
	stop    func()
}

// runFencedSQL measures each database and writes the markdown table to w.
func runFencedSQL(w io.Writer, round time.Duration, reps int, logf func(string, ...any)) error {
	dir, err := os.MkdirTemp("", "bench-fsql-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var targets []sqlTarget
	var notes []string
	for _, start := range []func(string) (sqlTarget, error){startBenchPostgres, startBenchMariaDB, openBenchSQLite} {
		t, err := start(dir)
		if err != nil {
			notes = append(notes, err.Error())
			logf("bench: fenced SQL: %v", err)
			continue
		}
		targets = append(targets, t)
	}
	defer func() {
		for _, t := range targets {
			t.db.Close()
			if t.stop != nil {
				t.stop()
			}
		}
	}()
	fmt.Fprintf(w, "\n### Fenced SQL writes against the same unfenced writes\n\n")
	fmt.Fprintf(w, "1 process × %d goroutines, each on its own row, one write after another; %d interleaved rounds of %v per way, medians. "+
		"**One statement:** `Table.Update(ctx, db, k, token, \"n = n + 1\")` (`UPDATE ... SET n = n + 1, fence = t WHERE key = k AND fence <= t`, a fresh token each time) "+
		"against the plain `UPDATE ... SET n = n + 1 WHERE key = k`. "+
		"**Read-modify-write shape:** `fence.InTx` claims the row under a fresh token (`UPDATE ... SET fence = t WHERE key = k AND fence <= t`) and then runs the update, "+
		"against the same update in a plain transaction (the claim is what fences a read; this shape has no read, to time the claim alone).\n\n", fencedSQLWorkers, reps, round)
	fmt.Fprintln(w, "| database | write | unfenced /s | fenced /s | unfenced p50 | fenced p50 | fenced / unfenced (p50) | statements |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---|")
	for _, t := range targets {
		for _, one := range []bool{true, false} {
			r, err := measureFencedSQL(t, round, reps, one)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			shape, stmts := "claim, then update, in a transaction", "BEGIN, UPDATE, COMMIT / BEGIN, claim, UPDATE, COMMIT"
			if one {
				shape, stmts = "one statement (`Table.Update`)", "UPDATE / UPDATE"
			}
			logf("bench: fenced SQL on %s, %s: %.0f vs %.0f /s", t.name, shape, r.plainRate, r.fencedRate)
			fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %s | %s | %.2f× | %s |\n", t.name, shape,
				r.plainRate, r.fencedRate, fmtDur(r.plainP50), fmtDur(r.fencedP50), float64(r.fencedP50)/float64(r.plainP50), stmts)
		}
	}
	for _, n := range notes {
		fmt.Fprintf(w, "\nSkipped: %s\n", n)
	}
	return nil
}

func fmtDur(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%d µs", d.Microseconds())
	}
	return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000)
}

type fencedSQLResult struct {
	plainRate, fencedRate float64
	plainP50, fencedP50   time.Duration
}

// measureFencedSQL times the fenced write against the same unfenced one: with one, a fenced
// Update statement against the plain UPDATE; else a transaction claiming the row, then updating
// it, against a transaction updating it.
func measureFencedSQL(t sqlTarget, round time.Duration, reps int, one bool) (fencedSQLResult, error) {
	ctx := context.Background()
	table := "bench_rows"
	if one {
		table = "bench_rows_one"
	}
	schema := "CREATE TABLE " + table + " (k BIGINT PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)"
	if t.dialect == fence.MySQL {
		schema += " ENGINE=InnoDB"
	}
	if _, err := t.db.ExecContext(ctx, schema); err != nil {
		return fencedSQLResult{}, err
	}
	tbl := fence.Table{Dialect: t.dialect, Name: table, KeyColumn: "k", FenceColumn: "fence"}
	for k := 0; k < fencedSQLWorkers; k++ {
		if err := tbl.Upsert(ctx, t.db, int64(k), 1, map[string]any{"n": 0}); err != nil {
			return fencedSQLResult{}, err
		}
	}
	upd := "UPDATE " + table + " SET n = n + 1 WHERE k = ?"
	if t.dialect == fence.PostgreSQL {
		upd = "UPDATE " + table + " SET n = n + 1 WHERE k = $1"
	}
	var token atomic.Uint64
	token.Store(1)
	write := func(fenced bool, k int64) error {
		if one {
			if fenced {
				return tbl.Update(ctx, t.db, k, token.Add(1), "n = n + 1")
			}
			_, err := t.db.ExecContext(ctx, upd, k)
			return err
		}
		if fenced {
			return fence.InTx(ctx, t.db, fence.Held(ctx, token.Add(1)), tbl, []int64{k}, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, upd, k)
				return err
			})
		}
		tx, err := t.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, upd, k); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	// One round: every worker writes its row for d; returns tx/s and the median tx time.
	oneRound := func(fenced bool, d time.Duration) (float64, time.Duration, error) {
		var wg sync.WaitGroup
		lat := make([][]time.Duration, fencedSQLWorkers)
		errs := make([]error, fencedSQLWorkers)
		start := time.Now()
		end := start.Add(d)
		for w := 0; w < fencedSQLWorkers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					t0 := time.Now()
					if err := write(fenced, int64(w)); err != nil {
						errs[w] = err
						return
					}
					lat[w] = append(lat[w], time.Since(t0))
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, 0, err
		}
		elapsed := time.Since(start)
		all := slices.Concat(lat...)
		if len(all) == 0 {
			return 0, 0, errors.New("no transaction finished")
		}
		slices.Sort(all)
		return float64(len(all)) / elapsed.Seconds(), all[len(all)/2], nil
	}
	// Warm up both ways (connections, caches), then interleave.
	for _, f := range []bool{false, true} {
		if _, _, err := oneRound(f, round/4); err != nil {
			return fencedSQLResult{}, err
		}
	}
	var pr, fr []float64
	var pl, fl []time.Duration
	for i := 0; i < reps; i++ {
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, f := range order {
			rate, p50, err := oneRound(f, round)
			if err != nil {
				return fencedSQLResult{}, err
			}
			if f {
				fr, fl = append(fr, rate), append(fl, p50)
			} else {
				pr, pl = append(pr, rate), append(pl, p50)
			}
		}
	}
	return fencedSQLResult{medianF(pr), medianF(fr), medianD(pl), medianD(fl)}, nil
}

func medianF(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }

func medianD(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func openBenchSQLite(dir string) (sqlTarget, error) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "bench.db")+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		return sqlTarget{}, err
	}
	db.SetMaxOpenConns(fencedSQLWorkers)
	db.SetMaxIdleConns(fencedSQLWorkers)
	return sqlTarget{name: "SQLite (modernc, WAL, one file)", dialect: fence.SQLite, db: db}, nil
}

func startBenchPostgres(dir string) (sqlTarget, error) {
	var bin string
	if p, err := exec.LookPath("initdb"); err == nil {
		bin = filepath.Dir(p)
	} else {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
		sort.Slice(found, func(i, j int) bool {
			vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(found[i]))))
			vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(found[j]))))
			return vi > vj
		})
		if len(found) == 0 {
			return sqlTarget{}, errors.New("PostgreSQL not installed (apt-get install -y postgresql)")
		}
		bin = filepath.Dir(found[0])
	}
	base := filepath.Join(dir, "pg")
	sock, data := filepath.Join(base, "sock"), filepath.Join(base, "data")
	if err := os.MkdirAll(sock, 0o700); err != nil {
		return sqlTarget{}, err
	}
	var as []string
	if os.Geteuid() == 0 { // PostgreSQL refuses root
		u, err := user.Lookup("postgres")
		if err != nil {
			return sqlTarget{}, fmt.Errorf("PostgreSQL: running as root with no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, d := range []string{dir, base, sock} {
			if err := os.Chown(d, uid, gid); err != nil {
				return sqlTarget{}, err
			}
		}
		as = []string{"runuser", "-u", "postgres", "--"}
	}
	run := func(args ...string) error {
		argv := append(append([]string{}, as...), args...)
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", filepath.Base(args[0]), err, out)
		}
		return nil
	}
	if err := run(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		return sqlTarget{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return sqlTarget{}, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// Durability as the fenced test servers have it (fsync off), the same for both ways.
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c synchronous_commit=off", port, sock)
	if err := run(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(base, "log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		return sqlTarget{}, err
	}
	stop := func() { run(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "fast", "-w", "stop") }
	db, err := sql.Open("pgx", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err != nil {
		stop()
		return sqlTarget{}, err
	}
	db.SetMaxOpenConns(fencedSQLWorkers)
	db.SetMaxIdleConns(fencedSQLWorkers)
	return sqlTarget{name: "PostgreSQL (pgx, loopback TCP)", dialect: fence.PostgreSQL, db: db, stop: stop}, nil
}

func startBenchMariaDB(dir string) (sqlTarget, error) {
	find := func(names ...string) string {
		for _, n := range names {
			if p, err := exec.LookPath(n); err == nil {
				return p
			}
			if st, err := os.Stat("/usr/sbin/" + n); err == nil && st.Mode()&0o111 != 0 {
				return "/usr/sbin/" + n
			}
		}
		return ""
	}
	install, daemon := find("mariadb-install-db", "mysql_install_db"), find("mariadbd", "mysqld")
	if install == "" || daemon == "" {
		return sqlTarget{}, errors.New("MariaDB not installed (apt-get install -y mariadb-server)")
	}
	base, err := os.MkdirTemp("", "bench-my-") // short: a socket path is limited
	if err != nil {
		return sqlTarget{}, err
	}
	data, sock := filepath.Join(base, "data"), filepath.Join(base, "sock")
	args := []string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	dargs := []string{"--no-defaults", "--datadir=" + data, "--socket=" + sock, "--skip-networking", "--skip-log-bin",
		"--pid-file=" + filepath.Join(base, "pid"), "--log-error=" + filepath.Join(base, "log"),
		"--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0"}
	if os.Geteuid() == 0 {
		args, dargs = append(args, "--user=root"), append(dargs, "--user=root")
	}
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		os.RemoveAll(base)
		return sqlTarget{}, fmt.Errorf("%s: %v: %s", install, err, out)
	}
	cmd := exec.Command(daemon, dargs...)
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(base)
		return sqlTarget{}, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		os.RemoveAll(base)
	}
	db, err := sql.Open("mysql", "root@unix("+sock+")/")
	if err != nil {
		stop()
		return sqlTarget{}, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for db.Ping() != nil {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(base, "log"))
			db.Close()
			stop()
			return sqlTarget{}, fmt.Errorf("mariadbd exited at start: %s", strings.TrimSpace(string(log)))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			db.Close()
			stop()
			return sqlTarget{}, errors.New("mariadbd did not answer within 60 s")
		}
	}
	db.Close()
	if db, err = sql.Open("mysql", "root@unix("+sock+")/mysql"); err == nil {
		_, err = db.Exec("CREATE DATABASE bench")
		db.Close()
	}
	if err == nil {
		db, err = sql.Open("mysql", "root@unix("+sock+")/bench")
	}
	if err != nil {
		stop()
		return sqlTarget{}, err
	}
	db.SetMaxOpenConns(fencedSQLWorkers)
	db.SetMaxIdleConns(fencedSQLWorkers)
	return sqlTarget{name: "MariaDB (InnoDB, unix socket)", dialect: fence.MySQL, db: db, stop: stop}, nil
}
