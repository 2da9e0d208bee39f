package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// webProc is "dlock web" running in this test process (dispatch, as main runs it).
type webProc struct {
	base   string // http://127.0.0.1:PORT
	stdout *syncBuffer
	stderr *syncBuffer
	http   *http.Client
	stop   func() int // interrupts it and returns its exit code
}

// startWeb runs "dlock web --listen 127.0.0.1:0 args..." until the test ends, and returns once
// it serves.
func startWeb(t *testing.T, args ...string) *webProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &webProc{stdout: &syncBuffer{}, stderr: &syncBuffer{}}
	done := make(chan int, 1)
	go func() {
		done <- dispatch(ctx, &stdio{in: strings.NewReader(""), out: p.stdout, err: p.stderr}, append([]string{"web", "--listen", "127.0.0.1:0"}, args...))
	}()
	tr := &http.Transport{}
	p.http = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	var once sync.Once
	code := -1
	p.stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(20 * time.Second):
				t.Errorf("dlock web did not stop within 20s")
			}
			tr.CloseIdleConnections()
		})
		return code
	}
	t.Cleanup(func() {
		if c := p.stop(); c != exitOK {
			t.Errorf("dlock web exited %d, want 0\nstderr: %s", c, p.stderr.String())
		}
	})
	serving := regexp.MustCompile(`serving (http://127\.0\.0\.1:\d+)/`)
	waitFor(t, 20*time.Second, "dlock web serving", func(context.Context) error {
		select {
		case c := <-done:
			done <- c
			return fmt.Errorf("dlock web exited %d: %s", c, p.stderr.String())
		default:
		}
		m := serving.FindStringSubmatch(p.stdout.String())
		if m == nil {
			return fmt.Errorf("stdout %q", p.stdout.String())
		}
		p.base = m[1]
		return nil
	})
	return p
}

// get fetches path and returns the status and body.
func (p *webProc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := p.http.Get(p.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// pageToken reads the unlock secret the page carries.
func (p *webProc) pageToken(t *testing.T) string {
	t.Helper()
	code, body := p.get(t, "/")
	m := regexp.MustCompile(`<meta name="dlock-token" content="([^"]+)">`).FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("GET /: %d, no token in\n%s", code, body)
	}
	return m[1]
}

// unlock posts an unlock request as the page does; edit changes it before it is sent.
func (p *webProc) unlock(t *testing.T, name string, token uint64, secret string, edit func(*http.Request)) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"name":%q,"token":%d}`, name, token)
	req, err := http.NewRequest(http.MethodPost, p.base+"/api/unlock", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", p.base)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Dlock-Token", secret)
	if edit != nil {
		edit(req)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// sseEvent is one event of /api/stream.
type sseEvent struct {
	name string
	data string
}

// stream is an open /api/stream.
type stream struct {
	events chan sseEvent
	body   io.Closer
}

func (p *webProc) openStream(t *testing.T) *stream {
	t.Helper()
	resp, err := p.http.Get(p.base + "/api/stream")
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		resp.Body.Close()
		t.Fatalf("GET /api/stream: %d %s", resp.StatusCode, ct)
	}
	s := &stream{events: make(chan sseEvent, 1024), body: resp.Body}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(s.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" {
					s.events <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	t.Cleanup(func() {
		resp.Body.Close()
		<-readDone
	})
	return s
}

// await reads events until match accepts one, failing the test after within.
func (s *stream) await(t *testing.T, within time.Duration, what string, match func(sseEvent) bool) sseEvent {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatalf("stream ended waiting for %s", what)
			}
			if match(ev) {
				return ev
			}
		case <-deadline.C:
			t.Fatalf("no %s within %v", what, within)
		}
	}
}

// stateWith is a match for await: a state event whose locks pass check.
func stateWith(t *testing.T, check func(map[string]pageLock) bool) func(sseEvent) bool {
	return func(ev sseEvent) bool {
		if ev.name != "state" {
			return false
		}
		var st pageState
		if err := json.Unmarshal([]byte(ev.data), &st); err != nil {
			t.Fatalf("state %s: %v", ev.data, err)
		}
		m := make(map[string]pageLock)
		for _, l := range st.Locks {
			m[l.Name] = l
		}
		return check(m)
	}
}

// historyWith is a match for await: a history event holding an entry that passes check.
func historyWith(t *testing.T, check func(webEvent) bool) func(sseEvent) bool {
	return func(ev sseEvent) bool {
		if ev.name != "history" {
			return false
		}
		var evs []webEvent
		if err := json.Unmarshal([]byte(ev.data), &evs); err != nil {
			t.Fatalf("history %s: %v", ev.data, err)
		}
		return slices.ContainsFunc(evs, check)
	}
}

func dialTest(t *testing.T, url string, opts ...dlock.ClientOption) *dlock.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func lockTest(t *testing.T, c *dlock.Client, name string, opts ...dlock.Option) *dlock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := c.Mutex(name, opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// /api/locks serves what "dlock list --json" prints, field for field, and filters by name
// prefix.
func TestWeb_APILocksAsListJSON(t *testing.T) {
	s := redistest.Start(t)
	c := dialTest(t, s.URL())
	for _, name := range []string{"orders:1", "orders:2", "reports:daily"} {
		lockTest(t, c, name, dlock.WithTTL(time.Minute), dlock.WithLabel("web test "+name))
	}
	w := startWeb(t, "--redis", s.URL())

	var list []map[string]any
	out := &syncBuffer{}
	if code := dispatch(context.Background(), &stdio{in: strings.NewReader(""), out: out, err: io.Discard}, []string{"list", "--json", "--redis", s.URL()}); code != exitOK {
		t.Fatalf("dlock list --json: exit %d", code)
	}
	if err := json.Unmarshal([]byte(out.String()), &list); err != nil {
		t.Fatal(err)
	}
	code, body := w.get(t, "/api/locks")
	var api []map[string]any
	if err := json.Unmarshal([]byte(body), &api); code != http.StatusOK || err != nil {
		t.Fatalf("GET /api/locks: %d %v\n%s", code, err, body)
	}
	if len(api) != 3 || len(list) != 3 {
		t.Fatalf("/api/locks has %d locks, dlock list %d; want 3", len(api), len(list))
	}
	for i := range api {
		// name_b64: the name's exact bytes, in both.
		if got, want := api[i]["name_b64"], base64.StdEncoding.EncodeToString([]byte(list[i]["name"].(string))); got != want {
			t.Errorf("%s: name_b64 %v, want %v", list[i]["name"], got, want)
		}
		if !slices.Equal(sortedKeys(api[i]), sortedKeys(list[i])) {
			t.Errorf("/api/locks fields %v, dlock list --json %v", sortedKeys(api[i]), sortedKeys(list[i]))
		}
		for k, v := range list[i] {
			if k == "ttl_ms" {
				if ttl := api[i][k].(float64); ttl <= 0 || ttl > 60000 {
					t.Errorf("%s: ttl_ms %v", list[i]["name"], ttl)
				}
				continue
			}
			if fmt.Sprint(api[i][k]) != fmt.Sprint(v) {
				t.Errorf("%s: %s is %v in /api/locks, %v in dlock list", list[i]["name"], k, api[i][k], v)
			}
		}
	}
	_, body = w.get(t, "/api/locks?name_prefix=orders:")
	var some []jsonInfo
	if err := json.Unmarshal([]byte(body), &some); err != nil || len(some) != 2 || some[0].Name != "orders:1" || some[1].Name != "orders:2" {
		t.Errorf("/api/locks?name_prefix=orders: = %s", body)
	}
}

func sortedKeys(m map[string]any) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}

// promSample matches one sample line of the text format: a name without labels, and a value.
var promSample = regexp.MustCompile(`^([a-z_]+) (-?[0-9.e+]+)$`)

// metricsOf reads /metrics, checking that every line is a HELP, a TYPE or a sample of a
// metric that has both.
func metricsOf(t *testing.T, w *webProc) map[string]float64 {
	t.Helper()
	code, body := w.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	vals := make(map[string]float64)
	help, typ := make(map[string]bool), make(map[string]bool)
	for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "#" && f[1] == "HELP" {
			help[f[2]] = true
			continue
		}
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && (f[3] == "gauge" || f[3] == "counter") {
			typ[f[2]] = true
			continue
		}
		m := promSample.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("/metrics: bad line %q", line)
		}
		if !help[m[1]] || !typ[m[1]] {
			t.Errorf("/metrics: %s without HELP and TYPE", m[1])
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("/metrics: %q: %v", line, err)
		}
		vals[m[1]] = v
	}
	return vals
}

// /metrics gives the server-side view as Prometheus gauges: locks held, waiting clients, the
// longest-held lock's age, and the exporter's health.
func TestWeb_Metrics(t *testing.T) {
	s := redistest.Start(t)
	holder := dialTest(t, s.URL())
	waiter := dialTest(t, s.URL())
	first := lockTest(t, holder, "jobs:a", dlock.WithTTL(time.Minute))
	lockTest(t, holder, "jobs:b", dlock.WithTTL(time.Minute))
	// One client waits for jobs:a, with two goroutines.
	wctx, stopWaiting := context.WithCancel(context.Background())
	waited := make(chan error, 2)
	for range 2 {
		go func() {
			l, err := waiter.Mutex("jobs:a").Lock(wctx)
			if err == nil {
				l.Unlock(context.Background())
			}
			waited <- err
		}()
	}
	defer func() {
		stopWaiting()
		<-waited
		<-waited
	}()
	w := startWeb(t, "--redis", s.URL(), "--refresh", "100ms")
	waitFor(t, 20*time.Second, "metrics: 2 locks, 1 waiting client with 2 goroutines, notices subscribed", func(context.Context) error {
		m := metricsOf(t, w)
		if m["dlock_server_up"] != 1 || m["dlock_server_locks_held"] != 2 || m["dlock_server_waiters"] != 1 ||
			m["dlock_server_waiting_goroutines"] != 2 || m["dlock_server_locks_contended"] != 1 || m["dlock_server_release_notices_subscribed"] != 1 {
			return fmt.Errorf("%v", m)
		}
		return nil
	})
	m := metricsOf(t, w)
	if v := m["dlock_server_oldest_lock_seconds"]; v <= 0 || v > 120 {
		t.Errorf("dlock_server_oldest_lock_seconds %v", v)
	}
	if m["dlock_server_refreshes_total"] < 1 || m["dlock_server_refresh_errors_total"] != 0 {
		t.Errorf("refreshes %v, errors %v", m["dlock_server_refreshes_total"], m["dlock_server_refresh_errors_total"])
	}
	if ts := m["dlock_server_last_refresh_timestamp_seconds"]; time.Since(time.UnixMilli(int64(ts*1000))) > time.Minute {
		t.Errorf("dlock_server_last_refresh_timestamp_seconds %v", ts)
	}
	// The release reaches the waiter, which takes and releases the lock: a listing sees one lock.
	if err := first.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "metrics: 1 lock, no waiter, notices counted", func(context.Context) error {
		m := metricsOf(t, w)
		if m["dlock_server_locks_held"] != 1 || m["dlock_server_waiters"] != 0 || m["dlock_server_release_notices_total"] < 1 {
			return fmt.Errorf("%v", m)
		}
		return nil
	})
}

// Started without --allow-unlock, the page has no unlock button and the endpoint refuses,
// even a request that carries the page's secret from its origin; the lock stays held.
func TestWeb_ReadOnlyRefusesUnlock(t *testing.T) {
	s := redistest.Start(t)
	c := dialTest(t, s.URL())
	l := lockTest(t, c, "ro:1", dlock.WithTTL(time.Minute))
	w := startWeb(t, "--redis", s.URL())
	_, page := w.get(t, "/")
	if !strings.Contains(page, `<meta name="dlock-allow-unlock" content="no">`) || !strings.Contains(page, "read-only") {
		t.Errorf("the read-only page does not say so:\n%s", page)
	}
	secret := w.pageToken(t)
	code, body := w.unlock(t, "ro:1", l.Token(), secret, nil)
	if code != http.StatusForbidden || !strings.Contains(body, "--allow-unlock") {
		t.Errorf("POST /api/unlock on a read-only server: %d %s; want 403 naming --allow-unlock", code, body)
	}
	if code, _ := w.get(t, "/api/unlock"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /api/unlock: %d, want 405", code)
	}
	info, err := c.Inspect(context.Background(), "ro:1")
	if err != nil || !info.Held || info.Token != l.Token() {
		t.Errorf("after the refusals: %+v, %v; want held with token %d", info, err, l.Token())
	}
}

// With --allow-unlock, the endpoint takes only a POST from the page's origin with the page's
// secret and a JSON body naming the token the page showed; then it frees the lock, and the
// holder loses it.
func TestWeb_UnlockFromPage(t *testing.T) {
	s := redistest.Start(t)
	c := dialTest(t, s.URL())
	l := lockTest(t, c, "rw:1", dlock.WithTTL(3*time.Second))
	w := startWeb(t, "--redis", s.URL(), "--allow-unlock")
	_, page := w.get(t, "/")
	if !strings.Contains(page, `<meta name="dlock-allow-unlock" content="yes">`) {
		t.Errorf("the page does not allow unlocking:\n%s", page)
	}
	secret := w.pageToken(t)
	for _, tc := range []struct {
		what  string
		token uint64
		edit  func(*http.Request)
		code  int
	}{
		{"no Origin", l.Token(), func(r *http.Request) { r.Header.Del("Origin") }, http.StatusForbidden},
		{"another origin", l.Token(), func(r *http.Request) { r.Header.Set("Origin", "http://evil.example") }, http.StatusForbidden},
		{"no secret", l.Token(), func(r *http.Request) { r.Header.Del("X-Dlock-Token") }, http.StatusForbidden},
		{"wrong secret", l.Token(), func(r *http.Request) { r.Header.Set("X-Dlock-Token", secret+"x") }, http.StatusForbidden},
		{"a form's content type", l.Token(), func(r *http.Request) { r.Header.Set("Content-Type", "application/x-www-form-urlencoded") }, http.StatusUnsupportedMediaType},
		{"another token", l.Token() + 1, nil, http.StatusConflict},
	} {
		if code, body := w.unlock(t, "rw:1", tc.token, secret, tc.edit); code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.what, code, body, tc.code)
		}
	}
	if info, err := c.Inspect(context.Background(), "rw:1"); err != nil || info.Token != l.Token() {
		t.Fatalf("after the refused requests: %+v, %v; want still held", info, err)
	}
	st := w.openStream(t)
	// Once the watcher's own subscription is confirmed, the release notice reaches it.
	st.await(t, 20*time.Second, "notices live", func(ev sseEvent) bool {
		return ev.name == "state" && strings.Contains(ev.data, `"notices":"live"`)
	})
	code, body := w.unlock(t, "rw:1", l.Token(), secret, nil)
	var reply unlockReply
	if err := json.Unmarshal([]byte(body), &reply); code != http.StatusOK || err != nil || reply.Released.Token != l.Token() || reply.Reached != 1 {
		t.Fatalf("unlock: %d %s (%v); want 200 releasing token %d, reaching this server's subscription", code, body, err, l.Token())
	}
	if info, err := c.Inspect(context.Background(), "rw:1"); err != nil || info.Held {
		t.Errorf("after the unlock: %+v, %v; want free", info, err)
	}
	st.await(t, 10*time.Second, "a force-unlocked history entry", historyWith(t, func(e webEvent) bool {
		return e.Name == "rw:1" && e.Kind == evForced && e.Token == l.Token()
	}))
	select {
	case <-l.Context().Done(): // its next renewal (a second in) finds the lock gone
	case <-time.After(20 * time.Second):
		t.Errorf("the holder's lease context is still live")
	}
	if code, body := w.unlock(t, "rw:1", 0, secret, nil); code != http.StatusConflict {
		t.Errorf("unlocking a free lock: %d %s, want 409", code, body)
	}
}

// Requests that name this server by a DNS name it was not given are refused (DNS rebinding).
func TestWeb_HostNames(t *testing.T) {
	s := redistest.Start(t)
	w := startWeb(t, "--redis", s.URL(), "--allow-host", "locks.internal")
	for host, want := range map[string]int{
		"":                     http.StatusOK,
		"localhost:8080":       http.StatusOK,
		"[::1]:8080":           http.StatusOK,
		"locks.internal:8080":  http.StatusOK,
		"attacker.example":     http.StatusMisdirectedRequest,
		"attacker.example:80":  http.StatusMisdirectedRequest,
		"locks.internal.evil":  http.StatusMisdirectedRequest,
		"localhost.example.io": http.StatusMisdirectedRequest,
	} {
		req, _ := http.NewRequest(http.MethodGet, w.base+"/api/locks", nil)
		if host != "" {
			req.Host = host
		}
		resp, err := w.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}
	// An address in use is a usage error.
	errOut := &syncBuffer{}
	addr := strings.TrimPrefix(w.base, "http://")
	if code := dispatch(context.Background(), &stdio{in: strings.NewReader(""), out: io.Discard, err: errOut}, []string{"web", "--redis", s.URL(), "--listen", addr}); code != exitUsage || !strings.Contains(errOut.String(), "in use") {
		t.Errorf("a second dlock web on %s: exit %d, %q; want %d, address in use", addr, code, errOut.String(), exitUsage)
	}
}

// A release reaches the stream at once, from the release notice: with a listing only every
// hour, the page still shows the lock go, with its hold time; a grant to a waiting client shows
// the lock passed on, and the new holder.
func TestWeb_StreamHearsReleases(t *testing.T) {
	s := redistest.Start(t)
	c := dialTest(t, s.URL(), dlock.WithPrefix("app:"))
	other := dialTest(t, s.URL(), dlock.WithPrefix("app:"))
	a := lockTest(t, c, "{braced}", dlock.WithTTL(time.Minute), dlock.WithLabel("first"))
	b := lockTest(t, c, "plain", dlock.WithTTL(time.Minute), dlock.WithLabel("first"))
	w := startWeb(t, "--redis", s.URL(), "--key-prefix", "app:", "--refresh", "1h")
	st := w.openStream(t)
	st.await(t, 20*time.Second, "both locks, notices live", func(ev sseEvent) bool {
		var p pageState
		json.Unmarshal([]byte(ev.data), &p)
		return ev.name == "state" && len(p.Locks) == 2 && p.Notices == noticesLive
	})

	if err := a.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	st.await(t, 10*time.Second, "a released entry with its hold time", historyWith(t, func(e webEvent) bool {
		return e.Name == "{braced}" && e.Kind == evReleased && e.Token == a.Token() && e.HoldMs != nil && strings.Contains(e.Holder, "first")
	}))
	st.await(t, 10*time.Second, "the lock gone from the state", stateWith(t, func(m map[string]pageLock) bool {
		_, held := m["{braced}"]
		return !held && m["plain"].TypicalHoldMs == nil && len(m) == 1
	}))

	// A client queues for "plain"; its release grants it to that client.
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := other.Mutex("plain", dlock.WithTTL(time.Minute), dlock.WithLabel("second")).Lock(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, 20*time.Second, "a queued client", func(ctx context.Context) error {
		i, err := c.Inspect(ctx, "plain")
		if err != nil || i.Waiters < 1 {
			return fmt.Errorf("%+v %v", i, err)
		}
		return nil
	})
	if err := b.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second == nil {
		t.FailNow()
	}
	defer second.Unlock(context.Background())
	st.await(t, 10*time.Second, "a granted entry", historyWith(t, func(e webEvent) bool {
		return e.Name == "plain" && e.Kind == evGranted && e.Token == second.Token()
	}))
	st.await(t, 10*time.Second, "the new holder in the state", stateWith(t, func(m map[string]pageLock) bool {
		l := m["plain"]
		return l.Token == second.Token() && l.Holder != nil && l.Holder.Label == "second" && l.TypicalHoldMs != nil
	}))
}

// A lock whose lease runs out (no release notice) shows as expired in the history.
func TestWeb_ExpiredLease(t *testing.T) {
	s := redistest.Start(t)
	w := startWeb(t, "--redis", s.URL(), "--refresh", "100ms")
	st := w.openStream(t)
	st.await(t, 20*time.Second, "notices live", func(ev sseEvent) bool {
		return ev.name == "state" && strings.Contains(ev.data, `"notices":"live"`)
	})
	token := rawLock(t, s, "crashed", map[string]any{"host": "elsewhere", "pid": 7}, 600*time.Millisecond)
	st.await(t, 10*time.Second, "an acquired entry", historyWith(t, func(e webEvent) bool {
		return e.Name == "crashed" && e.Kind == evAcquired && e.Token == token
	}))
	st.await(t, 10*time.Second, "an expired entry", historyWith(t, func(e webEvent) bool {
		return e.Name == "crashed" && e.Kind == evExpired && e.Token == token
	}))
}

// A user with exactly the ACL rule of docs/SECURITY.md may not PSUBSCRIBE: the page works,
// says why it hears no release notice, and shows releases at the next listing. With the
// additions docs/SECURITY.md gives for dlock web, it hears them.
func TestWeb_WithoutPatternSubscribe(t *testing.T) {
	const user, pass = "dlockuser", "pw"
	const webUser, webPass = "dlockweb", "webpw"
	args := redistest.ACLUserArgs(user, pass, redistest.ACLRule...)
	args = append(args, redistest.ACLUserArgs(webUser, webPass, append(slices.Clone(redistest.ACLRule), "+psubscribe", "+punsubscribe")...)...)
	s := redistest.Start(t, redistest.WithArgs(args...))
	full := startWeb(t, "--redis", s.URLAs(webUser, webPass), "--refresh", "1h")
	full.openStream(t).await(t, 20*time.Second, "notices live with +psubscribe", func(ev sseEvent) bool {
		return ev.name == "state" && strings.Contains(ev.data, `"notices":"live"`)
	})

	c := dialTest(t, s.URLAs(user, pass))
	l := lockTest(t, c, "acl:1", dlock.WithTTL(time.Minute))
	w := startWeb(t, "--redis", s.URLAs(user, pass), "--refresh", "100ms")
	st := w.openStream(t)
	st.await(t, 20*time.Second, "the notices refused, the lock shown", func(ev sseEvent) bool {
		var p pageState
		json.Unmarshal([]byte(ev.data), &p)
		return ev.name == "state" && len(p.Locks) == 1 && strings.HasPrefix(p.Notices, "unavailable:") && strings.Contains(p.Notices, "+psubscribe")
	})
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	st.await(t, 10*time.Second, "the lock gone", stateWith(t, func(m map[string]pageLock) bool { return len(m) == 0 }))
	st.await(t, 10*time.Second, "a gone entry", historyWith(t, func(e webEvent) bool {
		return e.Name == "acl:1" && e.Kind == evGone
	}))
	if m := metricsOf(t, w); m["dlock_server_release_notices_subscribed"] != 0 {
		t.Errorf("dlock_server_release_notices_subscribed %v, want 0", m["dlock_server_release_notices_subscribed"])
	}
	if strings.Contains(w.stdout.String()+w.stderr.String(), pass) {
		t.Errorf("the password was printed")
	}
}

// The page is served with its assets, and a policy that lets it load nothing from elsewhere.
func TestWeb_PageAndAssets(t *testing.T) {
	s := redistest.Start(t, redistest.WithArgs("--requirepass", "secretpw"))
	w := startWeb(t, "--redis", "redis://:secretpw@"+s.Addr+"/0")
	for path, want := range map[string]string{
		"/":                 "<title>dlock",
		"/static/app.js":    "EventSource",
		"/static/style.css": "--bg",
	} {
		code, body := w.get(t, path)
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, want 200 with %q", path, code, want)
		}
		if strings.Contains(body, "secretpw") {
			t.Errorf("GET %s shows the password", path)
		}
		if path == "/" && !strings.Contains(body, "redis://:xxxxx@") {
			t.Errorf("GET / does not show the server with its password masked")
		}
	}
	resp, err := w.http.Get(w.base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	for _, path := range []string{"/static/", "/nosuch", "/static/nosuch.js"} {
		if code, _ := w.get(t, path); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, code)
		}
	}
}

func TestWeb_Flags(t *testing.T) {
	for _, args := range [][]string{
		{"web", "--refresh", "10ms"},
		{"web", "extra"},
		{"web", "--allow-unlock=maybe"},
	} {
		errOut := &syncBuffer{}
		code := dispatch(context.Background(), &stdio{in: strings.NewReader(""), out: io.Discard, err: errOut}, args)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", args, code, exitUsage, errOut.String())
		}
	}
}

// Release channels name their locks in the key form of docs/PROTOCOL.md, braces included.
func TestWeb_LockNameOfKey(t *testing.T) {
	for _, name := range []string{"orders:42", "{x", "}x", "{{", "a}b", "a{b}", "x}:rel"} {
		key := keyOf(name)
		if name[0] == '{' || name[0] == '}' {
			key = dlock.DefaultPrefix + "{{" + name + "}"
		}
		if got, ok := lockNameOfKey(dlock.DefaultPrefix, key); !ok || got != name {
			t.Errorf("lockNameOfKey(%q) = %q, %v; want %q", key, got, ok, name)
		}
	}
	for _, key := range []string{"dlock:{}", "dlock:{{x}", "other:{x}", "dlock:x", "dlock:{x}:q", "dlock:{}x}"} {
		if got, ok := lockNameOfKey(dlock.DefaultPrefix, key); ok {
			t.Errorf("lockNameOfKey(%q) = %q, want not a lock key", key, got)
		}
	}
}

// The watcher's merge of listings and notices, step by step (no server): a grant replaces the
// holder, a listing begun before a notice does not undo it, late notices of earlier holders and
// the permission probe's "0" change nothing, and a lock gone from the listings without a
// notice is judged at the next listing.
func TestWeb_WatcherMerge(t *testing.T) {
	w := newWatcher(nil, "dlock:", "", time.Second)
	w.notices = noticesLive
	kinds := func() []string {
		var k []string
		for _, e := range w.eventsAfter(0) {
			k = append(k, e.Name+" "+e.Kind+" "+strconv.FormatUint(e.Token, 10))
		}
		w.events = nil
		return k
	}
	expect := func(step string, want ...string) {
		t.Helper()
		if got := kinds(); !slices.Equal(got, want) {
			t.Errorf("%s: events %q, want %q", step, got, want)
		}
	}
	held := func(name string, token uint64) dlock.Info {
		return dlock.Info{Name: name, Held: true, Token: token, Holds: 1, TTL: time.Minute, Waiters: 1, Holder: dlock.Holder{Host: "h", PID: 1}}
	}
	t0 := time.Now()
	w.merge([]dlock.Info{held("a", 100), held("b", 300)}, t0)
	expect("first listing", "a acquired 100", "b acquired 300")

	w.notice("dlock:{a}:rel", "g 200 c1.1 1000")
	expect("grant", "a released 100", "a granted 200")
	if l := w.locks["a"]; l == nil || l.info.Token != 200 || l.info.Waiters != 0 {
		t.Fatalf("after the grant: %+v", l)
	}
	w.merge([]dlock.Info{held("a", 100), held("b", 300)}, t0.Add(time.Millisecond)) // begun before the grant
	expect("a listing older than the grant")
	if l := w.locks["a"]; l == nil || l.info.Token != 200 {
		t.Fatalf("a stale listing undid the grant: %+v", l)
	}
	w.merge([]dlock.Info{held("a", 200), held("b", 300)}, time.Now())
	expect("the grant's holder listed")
	if l := w.locks["a"]; l.info.Holder.PID != 1 {
		t.Errorf("the listing did not fill in the new holder: %+v", l.info)
	}

	w.notice("dlock:{a}:rel", "150")
	w.notice("dlock:{a}:rel", "0")
	w.notice("dlock:{dlock-probe:ab12}:rel", "0")
	w.notice("other:{a}:rel", "900")
	w.notice("dlock:{a}:q", "900")
	expect("late, probe and foreign notices")

	before := time.Now()
	w.notice("dlock:{a}:rel", "200")
	expect("release", "a released 200")
	if w.locks["a"] != nil {
		t.Fatal("a still shown after its release")
	}
	w.merge([]dlock.Info{held("a", 200), held("b", 300)}, before) // begun before the release
	expect("a listing older than the release")
	if w.locks["a"] != nil {
		t.Fatal("a stale listing brought a back")
	}

	w.merge(nil, time.Now()) // b is gone, with no notice
	expect("b vanished")
	if w.locks["b"] != nil {
		t.Fatal("b still shown")
	}
	w.merge(nil, time.Now().Add(time.Millisecond))
	expect("the next listing", "b expired 300")

	w.notice("dlock:{c}:rel", "400")
	expect("a hold between two listings", "c released 400")
	w.notice("dlock:{c}:rel", "400")
	expect("the same notice again")
}

// While the server is down the page says that the listing fails (keeping the last one) and
// /metrics reports it; once the server is back, listings and the release notices resume.
func TestWeb_ServerDownAndBack(t *testing.T) {
	s := redistest.Start(t)
	w := startWeb(t, "--redis", s.URL(), "--refresh", "100ms")
	st := w.openStream(t)
	st.await(t, 20*time.Second, "notices live", func(ev sseEvent) bool {
		return ev.name == "state" && strings.Contains(ev.data, `"notices":"live"`)
	})
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	st.await(t, 30*time.Second, "the failure shown", func(ev sseEvent) bool {
		var p pageState
		json.Unmarshal([]byte(ev.data), &p)
		return ev.name == "state" && p.Error != "" && p.Notices != noticesLive && p.ReadAt != ""
	})
	if m := metricsOf(t, w); m["dlock_server_up"] != 0 || m["dlock_server_refresh_errors_total"] < 1 || m["dlock_server_release_notices_subscribed"] != 0 {
		t.Errorf("metrics while the server is down: %v", m)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	c := dialTest(t, s.URL())
	l := lockTest(t, c, "after:restart", dlock.WithTTL(time.Minute))
	st.await(t, 30*time.Second, "listings and notices back", func(ev sseEvent) bool {
		var p pageState
		json.Unmarshal([]byte(ev.data), &p)
		return ev.name == "state" && p.Error == "" && p.Notices == noticesLive && len(p.Locks) == 1
	})
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	st.await(t, 10*time.Second, "the release heard", historyWith(t, func(e webEvent) bool {
		return e.Name == "after:restart" && e.Kind == evReleased
	}))
}

// Read-write locks and semaphores are listed beside locks, with their kind and holders, on the
// page's feed, /api/locks and /metrics. They announce grants but not releases, so a release
// shows at the next listing, and the history calls it "gone" (released or expired), never a
// lease that ran out, even while the release notices of locks are heard. Their age counts from
// a writer's or the oldest permit holder's token; for readers alone, who carry the last
// writer's token, it is unknown (null).
func TestWeb_ReadWriteLocksAndSemaphores(t *testing.T) {
	s := redistest.Start(t)
	c := dialTest(t, s.URL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rw := c.RWMutex("catalog", dlock.WithTTL(time.Minute), dlock.WithLabel("catalog reader"))
	wl, err := rw.Lock(ctx) // a writer first: the readers below get its token
	if err != nil {
		t.Fatal(err)
	}
	if err := wl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var readers []*dlock.Lease
	for range 2 {
		l, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, l)
	}
	writer, err := c.RWMutex("ledger", dlock.WithTTL(time.Minute)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Unlock(ctx)
	permits, err := c.Semaphore("exports", 3, dlock.WithTTL(time.Minute)).Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}

	w := startWeb(t, "--redis", s.URL(), "--refresh", "100ms")
	st := w.openStream(t)
	st.await(t, 20*time.Second, "notices live and the three listed", func(ev sseEvent) bool {
		return strings.Contains(ev.data, `"notices":"live"`) && stateWith(t, func(m map[string]pageLock) bool {
			cat, led, exp := m["catalog"], m["ledger"], m["exports"]
			return cat.Kind == dlock.KindRWMutex && cat.Shared != nil && cat.Shared.Readers == 2 && len(cat.Shared.Holders) == 2 && cat.AgeMs == nil &&
				led.Kind == dlock.KindRWMutex && led.Shared != nil && led.Shared.Writer && led.Token == writer.Token() && led.AgeMs != nil &&
				exp.Kind == dlock.KindSemaphore && exp.Shared != nil && exp.Shared.Permits == 2 && exp.Shared.Size == 3 &&
				exp.Token == permits.Token() && exp.AgeMs != nil && *exp.AgeMs < 60_000
		})(ev)
	})
	_, body := w.get(t, "/api/locks")
	var api []jsonInfo
	if err := json.Unmarshal([]byte(body), &api); err != nil || len(api) != 3 {
		t.Fatalf("/api/locks = %s (%v), want the three", body, err)
	}
	for _, l := range api {
		if l.Kind == "" || l.Shared == nil || len(l.Shared.Holders) == 0 {
			t.Errorf("/api/locks: %+v, want a kind and the holders", l)
		}
	}
	if m := metricsOf(t, w); m["dlock_server_locks_held"] != 3 || m["dlock_server_oldest_lock_seconds"] > 60 {
		t.Errorf("/metrics: %v; want 3 held, the oldest under a minute (not from the readers' token)", m)
	}

	for _, l := range append(readers, permits) {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st.await(t, 20*time.Second, "only the writer listed", stateWith(t, func(m map[string]pageLock) bool {
		_, ok := m["ledger"]
		return len(m) == 1 && ok
	}))
	ended := make(map[string]webEvent)
	st.await(t, 20*time.Second, "both ends in the history", func(ev sseEvent) bool {
		if ev.name != "history" {
			return false
		}
		var evs []webEvent
		if err := json.Unmarshal([]byte(ev.data), &evs); err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if (e.Name == "catalog" || e.Name == "exports") && e.Kind != evAcquired {
				ended[e.Name] = e
			}
		}
		return len(ended) == 2
	})
	for name, e := range ended {
		if e.Kind != evGone || e.Detail != sharedEnd {
			t.Errorf("%s's end in the history: %+v, want %q: %s", name, e, evGone, sharedEnd)
		}
	}
}

// A lock handed on again and again is one history entry that counts its handoffs (a release
// and the grant after it are one), sent again with a new seq at each; the entries before the
// fold began are taken into it; an entry of another kind for that name ends the fold, and
// other locks' entries stay entries of their own.
func TestWeb_FoldsHotLock(t *testing.T) {
	w := newWatcher(nil, "dlock:", "", time.Second)
	w.notices = noticesLive
	token := uint64(1000)
	for range 10 { // taken and released between two listings: one entry each
		token += 100
		w.notice("dlock:{hot}:rel", strconv.FormatUint(token, 10))
	}
	w.merge([]dlock.Info{{Name: "rare", Held: true, Token: 50, Holds: 1, TTL: time.Minute, Waiters: -1}}, time.Now())
	for range 5 { // granted to a queued client: a release and a grant each
		token += 100
		w.notice("dlock:{hot}:rel", fmt.Sprintf("g %d c1.1 1000", token))
	}
	evs := w.eventsAfter(0)
	var got []string
	for _, e := range evs {
		got = append(got, e.Name+" "+e.Kind)
	}
	if !slices.Equal(got, []string{"rare acquired", "hot handoffs"}) {
		t.Fatalf("history %q, want the rare entry and one fold", got)
	}
	// 14 handoffs: the 10 holds released, and 4 released and granted to the next client (the
	// first grant follows a release already counted, and the last holder holds on).
	f := evs[1]
	if f.Fold == nil || f.Fold.Count != 14 || f.Fold.Kinds[evReleased] != 14 || f.Fold.Kinds[evGranted] != 5 || f.Token != token ||
		f.Fold.FirstSeq != 1 || f.Fold.ID != 1 || f.NameB64 != base64.StdEncoding.EncodeToString([]byte("hot")) {
		t.Fatalf("fold %+v %+v", f, f.Fold)
	}
	if sum := func() (n int) {
		for _, c := range f.Fold.Recent {
			n += c
		}
		return n
	}(); len(f.Fold.Recent) != foldRecent || sum != 14 {
		t.Errorf("recent %v, want %d seconds summing to 14", f.Fold.Recent, foldRecent)
	}
	// A client reading on from the fold's first copy gets its next copy, with the same ID.
	token += 100
	w.notice("dlock:{hot}:rel", strconv.FormatUint(token, 10))
	next := w.eventsAfter(f.Seq)
	if len(next) != 1 || next[0].Fold == nil || next[0].Fold.ID != f.Fold.ID || next[0].Fold.Count != 15 || next[0].Seq <= f.Seq {
		t.Fatalf("after one more handoff: %+v", next)
	}
	if n := len(w.eventsAfter(0)); n != 2 {
		t.Errorf("%d entries, want 2: the fold's earlier copy is gone", n)
	}
	// A force-unlock of hot ends its fold: the handoffs after it are entries of their own again.
	w.addEvent(webEvent{Name: "hot", Kind: evForced, Token: token})
	token += 100
	w.notice("dlock:{hot}:rel", strconv.FormatUint(token, 10))
	got = got[:0]
	for _, e := range w.eventsAfter(next[0].Seq) {
		got = append(got, e.Name+" "+e.Kind)
	}
	if !slices.Equal(got, []string{"hot force-unlocked", "hot released"}) {
		t.Errorf("after the force-unlock: %q", got)
	}
}

// A lock granted to a queued client has no holder until it is read: the page shows none (not
// an empty host and pid 0), and the Inspect that follows the grant's notice fills it in.
func TestWeb_GrantedHolderRead(t *testing.T) {
	s := redistest.Start(t)
	c := dialTest(t, s.URL())
	w := newWatcher(c, "dlock:", "", time.Hour)
	w.notices = noticesLive
	h := dlock.Holder{Host: "h", PID: 1, Label: "first"}
	w.merge([]dlock.Info{{Name: "a", Held: true, Token: 100, Holds: 1, TTL: time.Minute, Waiters: 1, Holder: h}}, time.Now())
	w.notice("dlock:{a}:rel", "g 200 c1.1 1000")
	if _, ok := w.pending["a"]; !ok {
		t.Fatal("the grant did not ask for the holder")
	}
	srv := &webServer{w: w}
	st := srv.pageState(w.view())
	if len(st.Locks) != 1 || st.Locks[0].Holder != nil || st.Locks[0].HolderAlive != nil || st.Locks[0].Token != 200 {
		t.Fatalf("before the holder is read: %+v", st.Locks)
	}
	read := dlock.Info{Name: "a", Held: true, Token: 200, Holds: 1, TTL: time.Second, Holder: dlock.Holder{Host: "h2", PID: 2, Label: "second"}}
	w.learnHolder("a", dlock.Info{Name: "a", Held: true, Token: 300, Holder: dlock.Holder{PID: 3}}, nil, time.Now()) // granted again since
	if w.locks["a"].info.Holder != (dlock.Holder{}) {
		t.Fatalf("a later holder was taken for the grant's: %+v", w.locks["a"].info)
	}
	w.learnHolder("a", read, nil, time.Now())
	st = srv.pageState(w.view())
	if hl := st.Locks[0].Holder; hl == nil || hl.Label != "second" || hl.PID != 2 || hl.Host != "h2" {
		t.Fatalf("after the holder is read: %+v", st.Locks[0])
	}
}

// The unlock endpoint takes the name's bytes (name_b64), for a name that is not UTF-8; the
// JSON form of such a name (U+FFFD for the bytes) names another lock.
func TestWeb_UnlockByNameB64(t *testing.T) {
	s := redistest.Start(t)
	c := dialTest(t, s.URL())
	const name = "\xff\xfe x"
	l := lockTest(t, c, name, dlock.WithTTL(time.Minute))
	w := startWeb(t, "--redis", s.URL(), "--allow-unlock")
	secret := w.pageToken(t)
	_, body := w.get(t, "/api/locks")
	var api []webInfo
	if err := json.Unmarshal([]byte(body), &api); err != nil || len(api) != 1 || api[0].NameB64 != base64.StdEncoding.EncodeToString([]byte(name)) {
		t.Fatalf("/api/locks: %s (%v)", body, err)
	}
	if code, body := w.unlock(t, api[0].Name, 0, secret, nil); code != http.StatusConflict {
		t.Errorf("unlock by the JSON name %q: %d %s, want 409 (no such lock held)", api[0].Name, code, body)
	}
	send := func(b string) (int, string) {
		return w.unlock(t, "", 0, secret, func(r *http.Request) {
			r.Body = io.NopCloser(strings.NewReader(b))
			r.ContentLength = int64(len(b))
		})
	}
	if code, body := send(`{"name_b64":"not base64!","token":0}`); code != http.StatusBadRequest {
		t.Errorf("bad base64: %d %s, want 400", code, body)
	}
	code, body := send(fmt.Sprintf(`{"name_b64":%q,"token":%d}`, api[0].NameB64, l.Token()))
	var reply unlockReply
	if err := json.Unmarshal([]byte(body), &reply); code != http.StatusOK || err != nil || reply.Released.Token != l.Token() || reply.Released.NameB64 != api[0].NameB64 {
		t.Fatalf("unlock by name_b64: %d %s (%v)", code, body, err)
	}
	if info, err := c.Inspect(context.Background(), name); err != nil || info.Held {
		t.Errorf("after the unlock: %+v, %v; want free", info, err)
	}
}

// An election shows in the stream from its announcements alone (a listing only every hour):
// its leader's value and term as soon as a term begins, the new value after a Proclaim, and
// after a Resign the next candidate's value and term, the former term ending in the history.
func TestWeb_Election(t *testing.T) {
	s := redistest.Start(t)
	a, b := dialTest(t, s.URL()), dialTest(t, s.URL())
	w := startWeb(t, "--redis", s.URL(), "--refresh", "1h")
	st := w.openStream(t)
	st.await(t, 20*time.Second, "notices live", func(ev sseEvent) bool {
		return ev.name == "state" && strings.Contains(ev.data, `"notices":"live"`)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leads := func(what, value string, term uint64, waiting int) {
		t.Helper()
		st.await(t, 10*time.Second, what, stateWith(t, func(m map[string]pageLock) bool {
			l, ok := m["scheduler"]
			return ok && l.Leader != nil && l.Leader.Value != nil && *l.Leader.Value == value && l.Leader.Term == term &&
				l.Token == term && l.Waiters == waiting && l.Holder != nil && l.Holder.PID == os.Getpid()
		}))
	}
	first, err := a.Election("scheduler", dlock.WithTTL(time.Minute)).Campaign(ctx, "replica-1")
	if err != nil {
		t.Fatal(err)
	}
	leads("the first leader", "replica-1", first.Term(), 0)
	if err := first.Proclaim(ctx, "replica-1 v2"); err != nil {
		t.Fatal(err)
	}
	leads("the leader's new value", "replica-1 v2", first.Term(), 0)

	got := make(chan *dlock.Leadership, 1)
	go func() {
		ld, err := b.Election("scheduler", dlock.WithTTL(time.Minute)).Campaign(ctx, "replica-2")
		if err != nil {
			t.Error(err)
		}
		got <- ld
	}()
	waitFor(t, 20*time.Second, "a candidate queued", func(ctx context.Context) error {
		if i, err := a.Inspect(ctx, "scheduler"); err != nil || i.Waiters != 1 {
			return fmt.Errorf("%+v %v", i, err)
		}
		return nil
	})
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second == nil {
		t.FailNow()
	}
	defer second.Resign(ctx)
	// The history comes before the state that follows it: await it first.
	st.await(t, 10*time.Second, "the first term's end in the history", historyWith(t, func(e webEvent) bool {
		return e.Name == "scheduler" && e.Kind == evReleased && e.Token == first.Term()
	}))
	leads("the next leader", "replica-2", second.Term(), 0)
}

// The watcher's handling of an election's announcement ("l <token>"), step by step (no
// server): it asks for the lock to be read again, unless the term is older than the one known or
// ended already; the read lock replaces the one known (the same term: its new value), a newer
// term ends the former hold, and a listing begun before the read does not undo it.
func TestWeb_WatcherLeaderNotice(t *testing.T) {
	w := newWatcher(nil, "dlock:", "", time.Second)
	w.notices = noticesLive
	kinds := func() []string {
		var k []string
		for _, e := range w.eventsAfter(0) {
			k = append(k, e.Name+" "+e.Kind+" "+strconv.FormatUint(e.Token, 10))
		}
		w.events = nil
		return k
	}
	expect := func(step string, want ...string) {
		t.Helper()
		if got := kinds(); !slices.Equal(got, want) {
			t.Errorf("%s: events %q, want %q", step, got, want)
		}
	}
	leader := func(token uint64, value string) dlock.Info {
		h := dlock.Holder{Host: "h", PID: 1}
		return dlock.Info{Name: "e", Held: true, Token: token, Holds: 1, TTL: time.Minute, Holder: h,
			Leader: &dlock.LeaderInfo{Value: value, Term: token, Holder: h}}
	}
	asked := func(step string, want bool) {
		t.Helper()
		again, ok := w.pending["e"]
		if ok != want || ok && !again {
			t.Errorf("%s: pending %v (%v), want a read again: %v", step, again, ok, want)
		}
		delete(w.pending, "e")
		select {
		case <-w.inspectNow:
		default:
		}
	}

	w.notice("dlock:{e}:rel", "l 100")
	asked("a term begins", true)
	w.learnLeader("e", leader(100, "one"), nil, time.Now())
	expect("the term read", "e acquired 100")
	if l := w.locks["e"]; l == nil || l.info.Leader == nil || l.info.Leader.Value != "one" {
		t.Fatalf("after the read: %+v", l)
	}
	w.notice("dlock:{e}:rel", "l 100")
	asked("a new value", true)
	read := time.Now()
	w.learnLeader("e", leader(100, "two"), nil, read)
	expect("the new value read")
	w.merge([]dlock.Info{leader(100, "one")}, read.Add(-time.Millisecond)) // begun before the read
	if l := w.locks["e"]; l.info.Leader.Value != "two" {
		t.Errorf("a listing older than the read undid the value: %q", l.info.Leader.Value)
	}
	w.notice("dlock:{e}:rel", "l 90")
	asked("an older term's announcement", false)
	w.notice("dlock:{e}:rel", "l x")
	asked("an announcement that does not read", false)

	w.learnLeader("e", leader(200, "next"), nil, time.Now())
	expect("the next term read", "e released 100", "e acquired 200")
	w.learnLeader("e", leader(150, "late"), nil, time.Now())
	expect("a read of an older term")
	if l := w.locks["e"]; l.info.Token != 200 || l.info.Leader.Value != "next" {
		t.Errorf("an older read replaced the lock: %+v", l.info)
	}
	w.notice("dlock:{e}:rel", "200")
	expect("the release", "e released 200")
	w.notice("dlock:{e}:rel", "l 200")
	asked("the announcement of a term that has ended", false)
	w.learnLeader("e", leader(200, "next"), nil, time.Now())
	expect("a read of a term that has ended")
	if w.locks["e"] != nil {
		t.Errorf("a term that has ended is shown: %+v", w.locks["e"])
	}
}
