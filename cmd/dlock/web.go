package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redact"
)

const webUsage = `
Serve a live page of the held locks at http://ADDR/ (--listen): name, holder (host, pid,
label), fencing token, lease left (counting down in the page), holds, waiting clients and the
typical hold time seen so far, with a filter by name prefix. Every change is pushed to the
page (server-sent events): the server lists the locks every --refresh (one SCAN walk, as
"dlock list" does, however many pages are open) and listens to the release notices, so a
release shows at once. While the page is open it shows each lock's history: acquired,
released, granted to a queued client, lease ran out (the holder lost it), force-unlocked.
A lock held by an election's leader ("dlock elect", dlock.Client.Election) shows as an
election: the leader's value, its term and the candidates waiting, updated as each term
begins and at each new value the leader proclaims (from the election's announcements).

The same data is served as JSON and as Prometheus gauges, so that one "dlock web" can be
scraped as a lock exporter:
  /            the page (HTML, CSS and JavaScript built into the binary: no CDN, no build step)
  /api/locks   a JSON array of the held locks, with the fields of "dlock list --json" and
               name_b64, the name's exact bytes in base64 (?name_prefix=TEXT filters)
  /api/stream  the page's feed (server-sent events)
  /metrics     Prometheus text format: dlock_server_locks_held, dlock_server_waiters,
               dlock_server_waiting_goroutines, dlock_server_oldest_lock_seconds and the exporter's own health (see docs)

Read-only unless started with --allow-unlock: then each row has a "Force unlock" button
(with a confirmation), which does what "dlock unlock --force" does, and only if the lock still
has the token the page showed (POST /api/unlock {"name_b64": ..., "token": ...}; "name" for a
UTF-8 name). The unlock endpoint takes POST only, from the page's own
origin, with a secret made at start and written into the page. The page has no login: keep
--listen on loopback (the default), or put it behind a proxy that authenticates, before you
allow unlocking. Requests must name this host as an IP address, "localhost", or a name given
with --allow-host (so that a web site cannot reach the page through a DNS name of its own).

Release notices come from one pattern subscription (PSUBSCRIBE <key-prefix>*): a user
restricted by the ACL rule of docs/SECURITY.md needs +psubscribe +punsubscribe as well.
Without it, and on Redis Cluster (sharded pub/sub has no patterns), the page says so and
releases show at the next refresh. On Redis Cluster the list covers the node dlock connects to.

It runs until interrupted (Ctrl-C, SIGTERM), then exits 0.

Examples:
  dlock web
  dlock web --listen 127.0.0.1:9090 --name-prefix orders: --allow-unlock
  curl -s http://127.0.0.1:8080/api/locks

`

// webLimits bound what the page server keeps and serves.
const (
	maxStreams    = 64               // concurrent /api/stream clients
	streamPing    = 15 * time.Second // a comment line keeps idle proxies from closing the stream
	writeTimeout  = 10 * time.Second // one write to a client that reads no more
	minRefreshGap = 100 * time.Millisecond
	unlockTimeout = 10 * time.Second
)

//go:embed web
var webAssets embed.FS

var pageTemplate = template.Must(template.ParseFS(webAssets, "web/index.html"))

func runWeb(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSet("web", webUsage+serverExitHelp+"\nA --listen address that cannot be used (in use, not this host's) exits 2 too.")
	var sf serverFlags
	sf.add(fs)
	listen := fs.String("listen", "127.0.0.1:8080", "serve on this `address` (host:port; port 0 picks a free one, printed at start)")
	prefix := fs.String("name-prefix", "", "show only the locks whose name starts with this `text` (a filter on names; not --key-prefix)")
	allowUnlock := fs.Bool("allow-unlock", false, "let the page force-unlock a lock (with a confirmation); read-only without it")
	refresh := fs.Duration("refresh", time.Second, "list the locks this often (at least 100ms)")
	var hosts hostList
	fs.Var(&hosts, "allow-host", "also accept requests to this host `name` (repeat or separate with commas), e.g. the name a proxy forwards")
	if done, code := parseFlags(fs, std, args, false); done {
		return code
	}
	if *refresh < minRefreshGap {
		fmt.Fprintf(std.err, "%s: --refresh %v is below 100ms\nRun \"%s --help\" for usage.\n", fs.Name(), *refresh, fs.Name())
		return exitUsage
	}
	c, code := sf.dial(ctx, std, "web")
	if c == nil {
		return code
	}
	defer c.Close()

	w := newWatcher(c, sf.keyPrefix, *prefix, *refresh)
	// The first listing at start: a server that cannot be used answers here, with list's exit codes.
	if err := w.refresh(ctx); err != nil {
		return report(std, "web", err)
	}
	w.startNotices(ctx, sf.serverURL())
	defer w.stopNotices()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(std.err, "dlock web: %v\n", err)
		return exitUsage
	}
	srv, err := newWebServer(w, webConfig{
		allowUnlock: *allowUnlock,
		hosts:       hosts,
		server:      redact.URL(sf.serverURL()),
		keyPrefix:   sf.keyPrefix,
		namePrefix:  *prefix,
	})
	if err != nil {
		ln.Close()
		fail(std, "web", err)
		return exitFailure
	}
	mode := "read-only"
	if *allowUnlock {
		mode = "force-unlock allowed"
	}
	fmt.Fprintf(std.out, "dlock web: serving http://%s/ (%s)\n", ln.Addr(), mode)
	if !isLoopback(ln.Addr()) {
		fmt.Fprintf(std.err, "dlock web: warning: %s is reachable from other machines and the page has no login\n", ln.Addr())
	}

	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	loopDone := make(chan struct{})
	loopCtx, stopLoop := context.WithCancel(ctx)
	go func() {
		defer close(loopDone)
		w.run(loopCtx)
	}()
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	code = exitOK
	select {
	case <-ctx.Done():
	case err := <-served:
		fail(std, "web", err)
		code = exitFailure
	}
	srv.close() // ends the event streams, which Shutdown does not interrupt
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	hs.Shutdown(sctx)
	cancel()
	stopLoop()
	<-loopDone
	return code
}

// hostList is --allow-host.
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }

func (h *hostList) Set(s string) error {
	for _, name := range strings.Split(s, ",") {
		if name = strings.TrimSpace(name); name != "" {
			*h = append(*h, strings.ToLower(name))
		}
	}
	return nil
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

type webConfig struct {
	allowUnlock bool
	hosts       []string
	server      string // the Redis URL, password masked
	keyPrefix   string
	namePrefix  string
}

// webServer is the HTTP side of dlock web: the page, its assets, its event stream, the JSON,
// the metrics and the unlock endpoint, over one watcher.
type webServer struct {
	w     *watcher
	cfg   webConfig
	token string // the per-process secret the page sends with an unlock
	mux   *http.ServeMux

	mu      sync.Mutex
	streams int
	quit    chan struct{} // closed by close: every stream ends
	closed  bool
}

func newWebServer(w *watcher, cfg webConfig) (*webServer, error) {
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	s := &webServer{w: w, cfg: cfg, token: base64.RawURLEncoding.EncodeToString(secret), quit: make(chan struct{})}
	static, err := fs.Sub(webAssets, "web")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.page)
	mux.Handle("GET /static/", http.StripPrefix("/static/", noIndex(http.FileServerFS(static))))
	mux.HandleFunc("GET /api/locks", s.apiLocks)
	mux.HandleFunc("GET /api/stream", s.stream)
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("/api/unlock", s.unlock)
	s.mux = mux
	return s, nil
}

// close ends the event streams.
func (s *webServer) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.quit)
	}
}

// ServeHTTP refuses requests for another host name (see allowedHost), then serves with the
// page's security headers.
func (s *webServer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	h := rw.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if !s.allowedHost(r.Host) {
		http.Error(rw, "dlock web: unknown host name "+fmt.Sprintf("%q", r.Host)+"; start dlock web with --allow-host to accept it", http.StatusMisdirectedRequest)
		return
	}
	s.mux.ServeHTTP(rw, r)
}

// allowedHost accepts a Host header that is an IP address, localhost, or a name given with
// --allow-host. A web page of another site cannot then reach this one by pointing a DNS name
// of its own at this address (DNS rebinding): its requests would carry that name.
func (s *webServer) allowedHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if host == "" {
		return false
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || net.ParseIP(host) != nil {
		return true
	}
	for _, h := range s.cfg.hosts {
		if host == h {
			return true
		}
	}
	return false
}

func noIndex(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(rw, r)
			return
		}
		h.ServeHTTP(rw, r)
	})
}

func (s *webServer) page(rw http.ResponseWriter, r *http.Request) {
	var b bytes.Buffer
	err := pageTemplate.Execute(&b, map[string]any{
		"Token":       s.token,
		"AllowUnlock": s.cfg.allowUnlock,
		"Server":      s.cfg.server,
		"KeyPrefix":   s.cfg.keyPrefix,
		"NamePrefix":  s.cfg.namePrefix,
		"Version":     buildVersion(),
	})
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "text/html; charset=utf-8")
	rw.Write(b.Bytes())
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	rw.Write(append(b, '\n'))
}

type apiError struct {
	Error string `json:"error"`
}

// apiLocks serves the held locks as "dlock list --json" prints them, from the last refresh
// (the remaining leases counted down to now), so that scrapes add no load on the server.
func (s *webServer) apiLocks(rw http.ResponseWriter, r *http.Request) {
	v := s.w.view()
	if v.err != nil && v.readAt.IsZero() {
		writeJSON(rw, http.StatusServiceUnavailable, apiError{oneLine(v.err)})
		return
	}
	prefix := r.URL.Query().Get("name_prefix")
	out := make([]webInfo, 0, len(v.locks))
	for _, l := range v.locks {
		if strings.HasPrefix(l.info.Name, prefix) {
			out = append(out, toWebJSON(l.current(v.now)))
		}
	}
	writeJSON(rw, http.StatusOK, out)
}

// webInfo is a lock in the web API: the fields of "dlock list --json", and the name's exact
// bytes. JSON text has no room for bytes that are not UTF-8 (encoding/json writes U+FFFD for
// them), and a lock name may be any bytes: name_b64 is what addresses the lock.
type webInfo struct {
	jsonInfo // with name_b64, the name's exact bytes
}

func toWebJSON(i dlock.Info) webInfo {
	j := webInfo{jsonInfo: toJSON(i)}
	if j.Holder != nil && i.Holder == (dlock.Holder{}) {
		// Held, the holder not read yet (a lock just granted to a queued client: see
		// inspectGrants): unknown, rather than an empty host and pid 0.
		j.Holder, j.HolderAlive = nil, nil
	}
	return j
}

// metrics writes the server-side view in the Prometheus text format (version 0.0.4).
func (s *webServer) metrics(rw http.ResponseWriter, r *http.Request) {
	v := s.w.view()
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	var b bytes.Buffer
	gauge := func(name, help string, value float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s %s\n", name, help, name, name, promFloat(value))
	}
	counter := func(name, help string, value uint64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, value)
	}
	up := 0.0
	if v.err == nil {
		up = 1
	}
	waiters, goroutines, contended, oldest := 0, 0, 0, 0.0
	serverNow := v.now.Add(v.offset)
	for _, l := range v.locks {
		if l.info.Waiters > 0 {
			waiters += l.info.Waiters
			goroutines += max(l.info.WaitingGoroutines, l.info.Waiters)
			contended++
		}
		if since, ok := heldSince(l.info); ok {
			oldest = max(oldest, serverNow.Sub(since).Seconds())
		}
	}
	gauge("dlock_server_up", "1 when the last listing of the locks succeeded, else 0.", up)
	gauge("dlock_server_locks_held", "Locks held, as the last listing saw them.", float64(len(v.locks)))
	gauge("dlock_server_waiters", "Clients waiting for the held locks (each client counts once per lock however many of its goroutines wait).", float64(waiters))
	gauge("dlock_server_waiting_goroutines", "Goroutines waiting for the held locks in those clients, as their queue entries report.", float64(goroutines))
	gauge("dlock_server_locks_contended", "Held locks with at least one waiting client.", float64(contended))
	gauge("dlock_server_oldest_lock_seconds", "How long the longest-held lock has been held (server clock, from its token); 0 when none is held.", oldest)
	if !v.readAt.IsZero() {
		gauge("dlock_server_last_refresh_timestamp_seconds", "When the locks were last listed successfully (Unix time).", float64(v.readAt.UnixMilli())/1000)
	}
	notices := 0.0
	if v.notices == noticesLive {
		notices = 1
	}
	gauge("dlock_server_release_notices_subscribed", "1 while the release notices are heard (pattern subscription confirmed), else 0.", notices)
	counter("dlock_server_refreshes_total", "Listings of the locks made.", v.refreshes)
	counter("dlock_server_refresh_errors_total", "Listings of the locks that failed.", v.refreshErrors)
	counter("dlock_server_release_notices_total", "Release notices heard (releases and grants).", v.noticeCount)
	rw.Write(b.Bytes())
}

// promFloat formats v as the text format wants it.
func promFloat(v float64) string {
	return strings.TrimSuffix(fmt.Sprintf("%.6f", v), ".000000")
}

// stream is the page's feed: an event "state" (the locks and the server's status) at once and
// after every change, and events "history" with the history entries the client has not had.
func (s *webServer) stream(rw http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.closed || s.streams >= maxStreams {
		s.mu.Unlock()
		http.Error(rw, "dlock web: too many open pages", http.StatusServiceUnavailable)
		return
	}
	s.streams++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.streams--
		s.mu.Unlock()
	}()

	sub := s.w.subscribe()
	defer s.w.unsubscribe(sub)
	rc := http.NewResponseController(rw)
	h := rw.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	rw.WriteHeader(http.StatusOK)

	var lastSeq uint64
	send := func() error {
		rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		v := s.w.view()
		events := s.w.eventsAfter(lastSeq)
		if n := len(events); n > 0 {
			lastSeq = events[n-1].Seq
			if err := writeEvent(rw, "history", events); err != nil {
				return err
			}
		}
		if err := writeEvent(rw, "state", s.pageState(v)); err != nil {
			return err
		}
		return rc.Flush()
	}
	if send() != nil {
		return
	}
	ping := time.NewTicker(streamPing)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.quit:
			return
		case <-sub:
			if send() != nil {
				return
			}
		case <-ping.C:
			rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := io.WriteString(rw, ": ping\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

func writeEvent(w io.Writer, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
	return err
}

// pageLock is a lock as the page shows it: the fields of "dlock list --json" and what this
// server learnt by watching it.
type pageLock struct {
	webInfo
	// AgeMs is how long it has been held (server clock, from the token; see heldSince); null
	// when that is not known (a read-write lock held by readers alone).
	AgeMs *int64 `json:"age_ms"`
	// TypicalHoldMs is the median of the holds of this lock that the server saw end
	// (released or force-unlocked); null before the first.
	TypicalHoldMs *int64 `json:"typical_hold_ms"`
	TypicalHoldUs *int64 `json:"typical_hold_us"` // the same in microseconds
	HoldsSeen     int    `json:"holds_seen"`
}

type pageState struct {
	Locks       []pageLock `json:"locks"`
	ReadAt      string     `json:"read_at,omitempty"` // last successful listing (RFC 3339, this host's clock)
	ReadAgeMs   int64      `json:"read_age_ms"`       // how long ago that was (the page counts on from there)
	Error       string     `json:"error,omitempty"`   // the last listing's error
	Notices     string     `json:"notices"`           // live, connecting, or why not
	Refresh     int64      `json:"refresh_ms"`
	AllowUnlock bool       `json:"allow_unlock"`
}

func (s *webServer) pageState(v webView) pageState {
	st := pageState{Locks: make([]pageLock, 0, len(v.locks)), Notices: v.notices, Refresh: s.w.interval.Milliseconds(), AllowUnlock: s.cfg.allowUnlock}
	if v.err != nil {
		st.Error = oneLine(v.err)
	}
	if !v.readAt.IsZero() {
		st.ReadAt = v.readAt.UTC().Format(time.RFC3339Nano)
		st.ReadAgeMs = v.now.Sub(v.readAt).Milliseconds()
	}
	serverNow := v.now.Add(v.offset)
	for _, l := range v.locks {
		pl := pageLock{webInfo: toWebJSON(l.current(v.now)), HoldsSeen: len(l.holds)}
		if since, ok := heldSince(l.info); ok {
			age := max(serverNow.Sub(since).Milliseconds(), 0)
			pl.AgeMs = &age
		}
		if m, ok := median(l.holds); ok {
			ms, us := m.Milliseconds(), m.Microseconds()
			pl.TypicalHoldMs, pl.TypicalHoldUs = &ms, &us
		}
		st.Locks = append(st.Locks, pl)
	}
	return st
}

type unlockRequest struct {
	Name string `json:"name"`
	// NameB64 is the name's bytes in standard base64 (the name_b64 of /api/locks), for a name
	// that is not UTF-8 text; it takes the place of name.
	NameB64 string `json:"name_b64"`
	Token   uint64 `json:"token"` // the token the page showed: the lock is released only if it still has it
}

const unlockBody = `the body must be JSON: {"name": ..., "token": ...} or {"name_b64": ..., "token": ...}`

type unlockReply struct {
	Released webInfo `json:"released"`
	// Reached is the number of clients the announcement reached: the client granted the lock
	// (the first queued), and the listeners of the release channel, this server's pattern
	// subscription among them.
	Reached int `json:"reached"`
}

// unlock force-unlocks a lock for the page. It refuses unless the server was started with
// --allow-unlock, and takes only a POST from the page's own origin carrying the page's secret
// in a header (a cross-site form cannot set a header, and a script of another site cannot
// read the page to learn the secret), with a JSON body.
func (s *webServer) unlock(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		rw.Header().Set("Allow", "POST")
		writeJSON(rw, http.StatusMethodNotAllowed, apiError{"POST only"})
		return
	}
	if !s.cfg.allowUnlock {
		writeJSON(rw, http.StatusForbidden, apiError{"read-only: dlock web was started without --allow-unlock"})
		return
	}
	if !s.sameOrigin(r) {
		writeJSON(rw, http.StatusForbidden, apiError{"refused: the request does not come from this page's origin"})
		return
	}
	if got := r.Header.Get("X-Dlock-Token"); subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) != 1 {
		writeJSON(rw, http.StatusForbidden, apiError{"refused: missing or wrong X-Dlock-Token (reload the page)"})
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeJSON(rw, http.StatusUnsupportedMediaType, apiError{unlockBody})
		return
	}
	var req unlockRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Name == "" && req.NameB64 == "" {
		writeJSON(rw, http.StatusBadRequest, apiError{unlockBody})
		return
	}
	if req.NameB64 != "" {
		b, err := base64.StdEncoding.DecodeString(req.NameB64)
		if err != nil || len(b) == 0 {
			writeJSON(rw, http.StatusBadRequest, apiError{"name_b64 must be the lock name's bytes in standard base64, as /api/locks gives it"})
			return
		}
		req.Name = string(b)
	}
	ctx, cancel := context.WithTimeout(r.Context(), unlockTimeout)
	defer cancel()
	info, err := s.w.forceUnlock(ctx, req.Name, req.Token)
	switch {
	case errors.Is(err, errChanged):
		writeJSON(rw, http.StatusConflict, apiError{oneLine(err)})
	case errors.Is(err, dlock.ErrNotHeld):
		writeJSON(rw, http.StatusConflict, apiError{oneLine(err)})
	case errors.Is(err, dlock.ErrInvalid):
		writeJSON(rw, http.StatusBadRequest, apiError{oneLine(err)})
	case err != nil:
		writeJSON(rw, http.StatusBadGateway, apiError{oneLine(err)})
	default:
		writeJSON(rw, http.StatusOK, unlockReply{Released: toWebJSON(info), Reached: info.Waiters})
	}
}

// sameOrigin reports whether r comes from a page of this server: its Origin (which browsers
// send with every POST) names this host. A request without Origin is refused unless its
// Sec-Fetch-Site says same-origin; tools such as curl send neither and must add an Origin.
func (s *webServer) sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return r.Header.Get("Sec-Fetch-Site") == "same-origin"
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}
