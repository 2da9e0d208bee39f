//go:build linux

package fencetest

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// The servers (PostgreSQL, MariaDB) start on first use and are shared by the tests; TestMain
// stops them. Each test gets a database of its own.

var (
	pgOnce sync.Once
	pg     *server
	pgErr  error

	myOnce sync.Once
	my     *server
	myErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, s := range []*server{pg, my} {
		if s != nil {
			if err := s.stop(); err != nil {
				fmt.Fprintf(os.Stderr, "stop %s: %v\n", s.name, err)
			}
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// server is a private database server whose files live in base.
type server struct {
	name string
	base string
	as   []string // command prefix: runuser -u postgres -- for PostgreSQL run as root
	stop func() error
	dsn  func(db string) string
}

func (s *server) run(name string, args ...string) ([]byte, error) {
	argv := append(append(append([]string{}, s.as...), name), args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = s.base
	return cmd.CombinedOutput()
}

var dbSeq struct {
	sync.Mutex
	n int
}

// freshName is a database name not used before in this run.
func freshName(t testing.TB) string {
	dbSeq.Lock()
	defer dbSeq.Unlock()
	dbSeq.n++
	return fmt.Sprintf("t%d", dbSeq.n)
}

// createDB creates a database on s with the admin connection and opens it.
func createDB(t testing.TB, s *server, driver, admin string) *sql.DB {
	t.Helper()
	name := freshName(t)
	a, err := sql.Open(driver, s.dsn(admin))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s on %s: %v", name, s.name, err)
	}
	db, err := sql.Open(driver, s.dsn(name))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(40)
	db.SetMaxIdleConns(40)
	t.Cleanup(func() { db.Close() })
	return db
}

// postgresDB returns a fresh database on the shared PostgreSQL server.
func postgresDB(t testing.TB) *sql.DB {
	t.Helper()
	pgOnce.Do(func() { pg, pgErr = startPostgres() })
	if pgErr != nil {
		t.Fatal(pgErr)
	}
	return createDB(t, pg, "pgx", "postgres")
}

// mariaDB returns a fresh database on the shared MariaDB server.
func mariaDB(t testing.TB) *sql.DB {
	t.Helper()
	myOnce.Do(func() { my, myErr = startMariaDB() })
	if myErr != nil {
		t.Fatal(myErr)
	}
	return createDB(t, my, "mysql", "mysql")
}

// sqliteDB opens a new SQLite file as a service would share it: WAL, a busy timeout (a writer
// waits for the write lock) and BEGIN IMMEDIATE (a transaction takes the write lock first).
func sqliteDB(t testing.TB) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fence.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	t.Cleanup(func() { db.Close() })
	return db
}

func findPostgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(found, func(i, j int) bool { // newest major version first
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(found[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(found[j]))))
		return vi > vj
	})
	if len(found) == 0 {
		return "", errors.New("PostgreSQL not found (no initdb on PATH or in /usr/lib/postgresql/*/bin): " +
			"install it with: apt-get install -y postgresql (make test does so)")
	}
	return filepath.Dir(found[0]), nil
}

// startPostgres runs initdb and a postgres server on a free loopback port, as the postgres
// user when running as root (PostgreSQL refuses root).
func startPostgres() (*server, error) {
	bin, err := findPostgresBin()
	if err != nil {
		return nil, err
	}
	s := &server{name: "PostgreSQL"}
	if s.base, err = os.MkdirTemp("", "fence-pg-"); err != nil {
		return nil, err
	}
	sock, data := filepath.Join(s.base, "sock"), filepath.Join(s.base, "data")
	if err := os.Mkdir(sock, 0o700); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(s.base)
			return nil, fmt.Errorf("running as root and there is no postgres user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, d := range []string{s.base, sock} {
			if err := os.Chown(d, uid, gid); err != nil {
				return nil, err
			}
		}
		s.as = []string{"runuser", "-u", "postgres", "--"}
	}
	if out, err := s.run(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(s.base)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	logf := filepath.Join(s.base, "postgres.log")
	for attempt := 0; ; attempt++ {
		port := freePort()
		// fsync off: these tests are about fencing, not durability.
		opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c synchronous_commit=off -c max_connections=200", port, sock)
		out, err := s.run(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", logf, "-w", "-t", "60", "-o", opts, "start")
		if err == nil {
			s.dsn = func(db string) string {
				return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, db)
			}
			s.stop = func() error {
				out, err := s.run(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "fast", "-w", "-t", "30", "stop")
				os.RemoveAll(s.base)
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				return nil
			}
			return s, nil
		}
		if attempt >= 2 { // another process may have taken the port: try another
			log, _ := os.ReadFile(logf)
			os.RemoveAll(s.base)
			return nil, fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
		}
	}
}

// startMariaDB runs mariadb-install-db and a mariadbd listening on a unix socket alone (no
// TCP port to race for), with InnoDB's defaults for isolation (REPEATABLE READ) and locking.
func startMariaDB() (*server, error) {
	install, daemon := lookFirst("mariadb-install-db", "mysql_install_db"), lookFirst("mariadbd", "mysqld")
	if install == "" || daemon == "" {
		return nil, errors.New("MariaDB not found (no mariadb-install-db and mariadbd): " +
			"install it with: apt-get install -y mariadb-server (make test does so)")
	}
	s := &server{name: "MariaDB"}
	var err error
	// A short path: a unix socket's path is limited to about 100 bytes.
	if s.base, err = os.MkdirTemp("", "fence-my-"); err != nil {
		return nil, err
	}
	data, sock, logf := filepath.Join(s.base, "data"), filepath.Join(s.base, "sock"), filepath.Join(s.base, "error.log")
	args := []string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if out, err := s.run(install, args...); err != nil {
		os.RemoveAll(s.base)
		return nil, fmt.Errorf("%s: %v\n%s", install, err, out)
	}
	dargs := []string{"--no-defaults", "--datadir=" + data, "--socket=" + sock, "--skip-networking",
		"--pid-file=" + filepath.Join(s.base, "pid"), "--log-error=" + logf, "--skip-log-bin",
		// Durability off and a small buffer pool: these tests are about fencing.
		"--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
		"--max-connections=300"}
	if os.Geteuid() == 0 {
		dargs = append(dargs, "--user=root")
	}
	cmd := exec.Command(daemon, dargs...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(s.base)
		return nil, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	kill := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		os.RemoveAll(s.base)
	}
	s.dsn = func(db string) string { return "root@unix(" + sock + ")/" + db }
	s.stop = func() error { kill(); return nil }
	// Ready when it answers on the socket.
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(logf)
			os.RemoveAll(s.base)
			return nil, fmt.Errorf("%s exited at start:\n%s", daemon, tail(log, 20))
		default:
		}
		if db, err := sql.Open("mysql", s.dsn("mysql")); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err = db.PingContext(ctx)
			cancel()
			db.Close()
			if err == nil {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf)
			kill()
			return nil, fmt.Errorf("%s did not answer on %s within 60 s:\n%s", daemon, sock, tail(log, 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lookFirst(names ...string) string {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
		for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
			if p := filepath.Join(dir, n); isExec(p) {
				return p
			}
		}
	}
	return ""
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort returns a loopback port that was free a moment ago.
func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedis runs a private redis-server without persistence on a free loopback port and
// returns its URL.
func startRedis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found on PATH; install it with: apt-get install -y redis-server")
	}
	for attempt := 0; ; attempt++ {
		port := freePort()
		dir := t.TempDir()
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		stop := func() {
			cmd.Process.Kill()
			<-exited
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := waitPing(addr, exited, 10*time.Second); err != nil {
			stop()
			if attempt < 3 {
				continue // another process took the port first
			}
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server on %s: %v\n%s", addr, err, log)
		}
		t.Cleanup(stop)
		return "redis://" + addr + "/0"
	}
}

func waitPing(addr string, exited <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		select {
		case <-exited:
			return errors.New("exited before answering PING")
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.SetDeadline(time.Now().Add(time.Second))
			_, err = c.Write([]byte("PING\r\n"))
			line := ""
			if err == nil {
				line, err = bufio.NewReader(c).ReadString('\n')
			}
			c.Close()
			if err == nil && strings.HasPrefix(line, "+PONG") {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
