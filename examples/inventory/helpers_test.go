//go:build linux

package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

	"go.uber.org/goleak"
)

// The e2e tests start real processes: redis-server, PostgreSQL, and the service binary built
// from this package. Everything they start is stopped by cleanups (PostgreSQL by TestMain).

var (
	tmpRoot string // removed by TestMain

	buildOnce sync.Once
	buildBin  string
	buildErr  error

	pgOnce sync.Once
	pg     *postgres
	pgErr  error
)

func TestMain(m *testing.M) {
	var err error
	tmpRoot, err = os.MkdirTemp("", "inventory-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testHTTP.CloseIdleConnections()
	if pg != nil {
		if err := pg.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop postgres:", err)
		}
	}
	os.RemoveAll(tmpRoot)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedis runs a private redis-server without persistence on a free loopback port.
func startRedis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found on PATH; install it with: apt-get install -y redis-server")
	}
	for attempt := 0; ; attempt++ {
		port := freePort(t)
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

// serviceBinary builds this package once per test run (with -race when the tests run with it).
func serviceBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildBin = filepath.Join(tmpRoot, "inventory")
		args := []string{"build", "-o", buildBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

// replica is one service process.
type replica struct {
	t      testing.TB
	name   string
	URL    string
	cmd    *exec.Cmd
	log    string // its stderr
	exited chan struct{}
	frozen string // what the freeze did, set by freezeWhileHolding
}

func startReplica(t testing.TB, name, redisURL, db string, extra ...string) *replica {
	t.Helper()
	bin := serviceBinary(t)
	r := &replica{t: t, name: name, log: filepath.Join(t.TempDir(), name+".log"), exited: make(chan struct{})}
	logf, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"--addr", "127.0.0.1:0", "--name", name, "--redis", redisURL, "--db", db}, extra...)
	r.cmd = exec.Command(bin, args...)
	r.cmd.Stderr = logf
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on ") {
				select {
				case lines <- sc.Text():
				default:
				}
			}
		}
		r.cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(r.stop)
	select {
	case line := <-lines:
		f := strings.Fields(line[strings.Index(line, "listening on ")+len("listening on "):])
		r.URL = f[0]
	case <-r.exited:
		t.Fatalf("replica %s exited at start:\n%s", name, r.tail(40))
	case <-time.After(60 * time.Second):
		t.Fatalf("replica %s did not start:\n%s", name, r.tail(40))
	}
	return r
}

func (r *replica) pid() int { return r.cmd.Process.Pid }

// stop ends the replica with SIGTERM (graceful shutdown), SIGKILL after 15 s.
func (r *replica) stop() {
	r.cmd.Process.Signal(syscall.SIGCONT)
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(15 * time.Second):
		r.t.Errorf("replica %s ignored SIGTERM for 15 s; killing it", r.name)
		r.cmd.Process.Kill()
		<-r.exited
	}
	if r.t.Failed() {
		r.t.Logf("log of replica %s (last lines):\n%s", r.name, r.tail(30))
	}
}

func (r *replica) tail(n int) string {
	b, _ := os.ReadFile(r.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logCount counts the lines of the replica's log that contain s.
func (r *replica) logCount(s string) int {
	b, _ := os.ReadFile(r.log)
	return strings.Count(string(b), s)
}

var testHTTP = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}

func call(t testing.TB, method, url string, into any) int {
	t.Helper()
	code, err := callErr(method, url, into)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// callErr is call for goroutines other than the test's.
func callErr(method, url string, into any) (int, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := testHTTP.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if into != nil {
		if err := json.Unmarshal(body, into); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: %d %q: %w", method, url, resp.StatusCode, body, err)
		}
	}
	return resp.StatusCode, nil
}

func (r *replica) stats(t testing.TB) StatsBody {
	t.Helper()
	s, err := r.statsErr()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (r *replica) statsErr() (StatsBody, error) {
	var s StatsBody
	code, err := callErr("GET", r.URL+"/stats", &s)
	if err == nil && code != 200 {
		err = fmt.Errorf("stats of %s: %d", r.name, code)
	}
	return s, err
}

// postgres is a private PostgreSQL server on a loopback port.
type postgres struct {
	bin  string // directory of initdb, pg_ctl
	base string
	data string
	port int
	as   []string // command prefix: runuser -u postgres -- when running as root
}

// postgresURL returns the URL of a fresh database called name on the shared test server,
// starting the server on first use.
func postgresURL(t testing.TB, name string) string {
	t.Helper()
	pgOnce.Do(func() { pg, pgErr = startPostgres() })
	if pgErr != nil {
		t.Fatal(pgErr)
	}
	admin := pg.url("postgres")
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	return pg.url(name)
}

func (p *postgres) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
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
			"install it with: apt-get install -y postgresql (make test-examples does so)")
	}
	return filepath.Dir(found[0]), nil
}

func startPostgres() (*postgres, error) {
	bin, err := findPostgresBin()
	if err != nil {
		return nil, err
	}
	p := &postgres{bin: bin}
	p.base, err = os.MkdirTemp("", "inventory-pg-")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(p.base, "sock")
	p.data = filepath.Join(p.base, "data")
	if err := os.Mkdir(sock, 0o700); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: run it as the postgres user, owning its files.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root and there is no postgres user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, d := range []string{p.base, sock} {
			if err := os.Chown(d, uid, gid); err != nil {
				return nil, err
			}
		}
		p.as = []string{"runuser", "-u", "postgres", "--"}
	}
	if out, err := p.run(filepath.Join(bin, "initdb"), "-D", p.data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-sync"); err != nil {
		p.cleanup()
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		p.port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		// fsync off: these tests are about locking and fencing, not durability.
		opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c synchronous_commit=off -c max_connections=200", p.port, sock)
		out, err := p.run(filepath.Join(bin, "pg_ctl"), "-D", p.data, "-l", filepath.Join(p.base, "postgres.log"),
			"-w", "-t", "60", "-o", opts, "start")
		if err == nil {
			return p, nil
		}
		if attempt >= 2 {
			log, _ := os.ReadFile(filepath.Join(p.base, "postgres.log"))
			p.cleanup()
			return nil, fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
		}
	}
}

func (p *postgres) run(name string, args ...string) ([]byte, error) {
	argv := append(append(append([]string{}, p.as...), name), args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = p.base
	return cmd.CombinedOutput()
}

func (p *postgres) stop() error {
	out, err := p.run(filepath.Join(p.bin, "pg_ctl"), "-D", p.data, "-m", "fast", "-w", "-t", "30", "stop")
	p.cleanup()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

func (p *postgres) cleanup() { os.RemoveAll(p.base) }

// metrics reads the replica's /metrics: each sample by its name and labels as exposed,
// name{label="value",...} (labels in the exposition's order, which is sorted), or name alone.
func (r *replica) metrics(t testing.TB) map[string]float64 {
	t.Helper()
	resp, err := testHTTP.Get(r.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d, %v", resp.StatusCode, err)
	}
	out := make(map[string]float64)
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("GET /metrics: bad line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}
