package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
)

// defaultRedisURL is where run, status, list and unlock connect without --redis.
const defaultRedisURL = "redis://127.0.0.1:6379/0"

// redisEnv names the environment variable that overrides defaultRedisURL.
const redisEnv = "DLOCK_REDIS_URL"

// dialTimeout bounds connecting to the server.
const dialTimeout = 5 * time.Second

// serverFlags are the flags of every command that talks to a Redis server.
type serverFlags struct {
	url       string
	urlSet    bool // --redis was given, even as an empty string
	keyPrefix string
	// locking is set (addLocking) for a command that takes locks or counts a latch down: it
	// refuses a server that may evict keys unless --unsafe-eviction (unsafeEviction) is given.
	// The other commands only read or administer: they go on with a warning.
	locking        bool
	unsafeEviction bool
}

// commonFlags are the flags that every command talking to a server has (serverFlags.add),
// which may also come before the command: "dlock --redis URL status NAME".
var commonFlags = []string{"redis", "key-prefix"}

// addLocking registers --unsafe-eviction, for a command that takes locks.
func (f *serverFlags) addLocking(fs *flag.FlagSet) {
	f.locking = true
	fs.BoolVar(&f.unsafeEviction, "unsafe-eviction", false, "use a server whose maxmemory-policy may evict keys (maxmemory set, policy not noeviction), "+
		"which is refused without it: an evicted lock can be taken by a second holder while the first still runs")
}

func (f *serverFlags) add(fs *flag.FlagSet) {
	// No flag default: it would show the environment's URL, password included, in --help, and
	// "(default ...)" a second time after the text below.
	fs.Var(urlFlag{f}, "redis", "the Redis server's `URL`: redis://[user:password@]host:port[/db], rediss://..., "+
		"redis+sentinel://... or unix://path (default: $"+redisEnv+" when set, else "+defaultRedisURL+")")
	fs.StringVar(&f.keyPrefix, "key-prefix", dlock.DefaultPrefix, "the key `prefix` of the deployment, as its programs set it with "+
		"dlock.WithPrefix: lock NAME is the key <key-prefix>{NAME}. Not a filter on lock names")
}

// urlFlag is --redis: a string flag that also records that it was given, so that an empty
// value (--redis "$UNSET") is refused instead of read as "not given".
type urlFlag struct{ f *serverFlags }

func (u urlFlag) String() string {
	if u.f == nil {
		return ""
	}
	return u.f.url
}

func (u urlFlag) Set(v string) error {
	u.f.url, u.f.urlSet = v, true
	return nil
}

// urlErr refuses an empty --redis, or a $DLOCK_REDIS_URL set to an empty string, when that is
// where the URL would come from: an unset shell variable (--redis "$REDIS_URL") must not send
// the command to whatever listens on localhost.
func (f *serverFlags) urlErr() error {
	if f.urlSet {
		if strings.TrimSpace(f.url) == "" {
			return fmt.Errorf("%w: --redis is empty: give the server's URL, or leave the flag out to use $%s or %s (an unset shell variable is the usual cause)",
				dlock.ErrInvalid, redisEnv, defaultRedisURL)
		}
		return nil
	}
	if v, ok := os.LookupEnv(redisEnv); ok && strings.TrimSpace(v) == "" {
		return fmt.Errorf("%w: $%s is set but empty: set it to the server's URL, or unset it to use %s",
			dlock.ErrInvalid, redisEnv, defaultRedisURL)
	}
	return nil
}

// serverURL is --redis, else $DLOCK_REDIS_URL, else defaultRedisURL.
func (f *serverFlags) serverURL() string {
	if f.url != "" {
		return f.url
	}
	if u := os.Getenv(redisEnv); u != "" {
		return u
	}
	return defaultRedisURL
}

// dial connects; on failure it prints one line and returns the exit code (see errCode). A
// server whose memory policy may evict keys is refused for a command that takes locks (unless
// --unsafe-eviction), and used with a one-line warning on stderr by the others (evictWarner).
func (f *serverFlags) dial(ctx context.Context, std *stdio, cmd string, opts ...dlock.ClientOption) (*dlock.Client, int) {
	if err := f.urlErr(); err != nil {
		return nil, report(std, cmd, err)
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	opts = append([]dlock.ClientOption{dlock.WithPrefix(f.keyPrefix)}, opts...)
	if !f.locking || f.unsafeEviction {
		opts = append(opts, dlock.WithUnsafeEviction(), dlock.WithLogger(slog.New(&evictWarner{w: std.err, cmd: cmd, locking: f.locking})))
	}
	c, err := dlock.Dial(dctx, f.serverURL(), opts...)
	if err != nil {
		return nil, report(std, cmd, err)
	}
	return c, exitOK
}

// report prints err as one line on stderr, as fail does, and returns its exit code (errCode).
// A refusal by the server's access rules says so and where the needed ACL rule is written.
func report(std *stdio, cmd string, err error) int {
	code := errCode(err)
	if code != exitDenied {
		fail(std, cmd, err)
		return code
	}
	msg := oneLine(err)
	// Said by "access denied": the class, as a suffix "(dlock: permission denied)" or a prefix.
	msg = strings.TrimSuffix(msg, " ("+dlock.ErrDenied.Error()+")")
	msg = strings.TrimPrefix(msg, strings.TrimPrefix(dlock.ErrDenied.Error(), "dlock: ")+": ")
	fmt.Fprintf(std.err, "dlock %s: access denied: %s; %s\n", cmd, msg, deniedHint(msg))
	return code
}

// deniedHint is what to do about the denial msg: for a refused login (user or password), check
// them; in any case, give the user the ACL rule dlock needs.
func deniedHint(msg string) string {
	hint := "the user needs the ACL rule of docs/SECURITY.md (\"The minimal ACL rule\")"
	if strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "invalid username-password") {
		hint = "check the user and password in the URL (--redis or $" + redisEnv + "); " + hint
	}
	return hint
}

// fail prints err as one line on stderr: "dlock <cmd>: <error>". The library's advice to use
// dlock.WithUnsafeEviction becomes the command's flag.
func fail(std *stdio, cmd string, err error) {
	msg := strings.ReplaceAll(oneLine(err), "dlock.WithUnsafeEviction", "dlock "+cmd+" --unsafe-eviction")
	fmt.Fprintf(std.err, "dlock %s: %s\n", cmd, msg)
}

// evictWarner is the logger of a client that goes on with a server that may evict keys: each
// warning of the library is one line on stderr, "dlock <cmd>: warning: ...", the eviction
// risk in the command's own words.
type evictWarner struct {
	w       io.Writer
	cmd     string
	locking bool // --unsafe-eviction: the command takes locks all the same
	mu      sync.Mutex
}

func (h *evictWarner) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *evictWarner) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *evictWarner) WithGroup(string) slog.Handler                { return h }

func (h *evictWarner) Handle(_ context.Context, r slog.Record) error {
	attrs := map[string]string{}
	var rest []string
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		rest = append(rest, a.Key+"="+a.Value.String())
		return true
	})
	msg := strings.TrimPrefix(r.Message, "dlock: ")
	if strings.HasPrefix(msg, "server may evict lock keys") {
		msg = fmt.Sprintf("server %s may evict lock keys (maxmemory %s bytes, maxmemory-policy %s", display(attrs["server"]), attrs["maxmemory"], display(attrs["maxmemory_policy"]))
		if n := attrs["evicted_since_last_check"]; n != "" && n != "0" {
			msg += ", " + n + " keys evicted since the last check"
		}
		if h.locking {
			msg += "); going on as --unsafe-eviction allows: a lock whose key is evicted can be taken by another holder before this one learns it lost it"
		} else {
			msg += "); only reading and administering: what it shows may miss evicted locks, and commands that take locks refuse it without --unsafe-eviction"
		}
	} else if len(rest) > 0 {
		msg += " (" + strings.Join(rest, ", ") + ")"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := fmt.Fprintf(h.w, "dlock %s: warning: %s\n", h.cmd, strings.ReplaceAll(msg, "\n", "; "))
	return err
}

// oneLine is err's message on one line, without the "dlock: " prefixes of the library.
func oneLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	for strings.HasPrefix(msg, "dlock: ") {
		msg = strings.TrimPrefix(msg, "dlock: ")
	}
	return msg
}

// errCode is the exit code for an error of the library, by its class: bad input (a bad URL
// too) is a usage error (2), a refusal by the server's access rules 77, a lock that was not
// held or an interrupted call 1, and anything else comes from the server: 69 when it cannot
// be reached (ErrUnavailable), and also when it cannot be used (for example, it may evict
// lock keys; the message says why).
func errCode(err error) int {
	switch {
	case errors.Is(err, dlock.ErrInvalid):
		return exitUsage
	case errors.Is(err, dlock.ErrDenied):
		return exitDenied
	case errors.Is(err, dlock.ErrNotHeld), errors.Is(err, context.Canceled):
		return exitFailure
	}
	return exitNoServer
}

// parseInterleaved parses flags that may come before and after the positional arguments
// (the flag package stops at the first positional one), up to a "--".
func parseInterleaved(fs *flag.FlagSet, std *stdio, args []string) (positional []string, done bool, code int) {
	for {
		if done, code := parseFlags(fs, std, args, true); done {
			return nil, true, code
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, false, exitOK
		}
		if len(args) > 0 && len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), false, exitOK // everything after -- is positional
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// jsonInfo is the JSON form of a lock in "dlock status --json" and "dlock list --json".
type jsonInfo struct {
	Name        string      `json:"name"`
	NameB64     string      `json:"name_b64"` // the exact bytes of the name (a name need not be UTF-8)
	Held        bool        `json:"held"`
	Token       uint64      `json:"token"`
	TokenTime   string      `json:"token_time,omitempty"`
	Holds       int         `json:"holds"`
	TTLms       int64       `json:"ttl_ms"`
	Holder      *jsonHolder `json:"holder,omitempty"`
	HolderAlive *bool       `json:"holder_alive"` // holderAlive's answer; null when unknown
	Waiters     int         `json:"waiters"`
	Kind        string      `json:"kind,omitempty"`   // "rwmutex" or "semaphore"; omitted for a lock
	Shared      *jsonShared `json:"shared,omitempty"` // their holders and waiters (shared.go)
	HoldStats   *jsonHolds  `json:"hold_stats,omitempty"`
	Leader      *jsonLeader `json:"leader,omitempty"` // held by an election's leader (leader.go)
	// Goroutines: waiting in those clients, as their queue entries report (-1 when unknown).
	Goroutines int `json:"waiting_goroutines"`
}

// jsonHolds is dlock.HoldStats in JSON: durations in milliseconds, to the microsecond.
type jsonHolds struct {
	Count     int64   `json:"count"`
	TypicalMS float64 `json:"typical_ms"`
	HighMS    float64 `json:"high_ms"`
	LastMS    float64 `json:"last_ms"`
	ExpiresMS int64   `json:"expires_ms"`
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type jsonHolder struct {
	Host  string `json:"host"`
	PID   int    `json:"pid"`
	Start string `json:"start,omitempty"`
	Label string `json:"label,omitempty"`
}

func toJSON(i dlock.Info) jsonInfo {
	j := jsonInfo{Name: i.Name, NameB64: b64Name(i.Name), Held: i.Held, Token: i.Token, Holds: i.Holds, TTLms: i.TTL.Milliseconds(), Waiters: i.Waiters,
		Kind: i.Kind, Shared: toJSONShared(i.Shared), Goroutines: i.WaitingGoroutines, Leader: lockLeaderJSON(i.Leader)}
	if i.Token != 0 {
		j.TokenTime = i.TokenTime().UTC().Format(time.RFC3339Nano)
	}
	if i.Held {
		j.Holder = &jsonHolder{Host: i.Holder.Host, PID: i.Holder.PID, Label: i.Holder.Label}
		if !i.Holder.Start.IsZero() {
			j.Holder.Start = i.Holder.Start.UTC().Format(time.RFC3339)
		}
		j.HolderAlive, _ = holderAlive(i)
	}
	if h := i.HoldStats; h.Count > 0 {
		j.HoldStats = &jsonHolds{Count: h.Count, TypicalMS: msOf(h.Typical), HighMS: msOf(h.High), LastMS: msOf(h.Last), ExpiresMS: h.Expires.Milliseconds()}
	}
	return j
}

// b64Name is name_b64 in JSON: the standard base64 of the name's bytes.
func b64Name(name string) string { return base64.StdEncoding.EncodeToString([]byte(name)) }

// b64Help is the --b64 flag's text.
const b64Help = "the NAME arguments are the standard base64 of the names' bytes, as --json prints them in name_b64: for names " +
	"that are not valid UTF-8 or are hard to type"

// addB64Flag registers --b64 (decodeNames).
func addB64Flag(fs *flag.FlagSet) *bool {
	return fs.Bool("b64", false, b64Help)
}

// decodeNames returns names as given or, with b64, decoded from standard base64; a bad one is
// a usage error (printed; ok false).
// parseOneName parses args of a command that takes one lock name: NAME, or its base64 with
// --b64 (b64, read once the flags are parsed). done reports that the command ends here, with
// code: help was asked for, or a usage error was printed.
func parseOneName(fs *flag.FlagSet, std *stdio, args []string, b64 *bool) (name string, done bool, code int) {
	pos, done, code := parseInterleaved(fs, std, args)
	if done {
		return "", true, code
	}
	if len(pos) != 1 {
		return "", true, usageErr(fs, std, pos, "NAME")
	}
	names, ok := decodeNames(fs, std, pos, *b64)
	if !ok {
		return "", true, exitUsage
	}
	return names[0], false, 0
}

func decodeNames(fs *flag.FlagSet, std *stdio, names []string, b64 bool) (out []string, ok bool) {
	if !b64 {
		return names, true
	}
	out = make([]string, len(names))
	for i, n := range names {
		b, err := base64.StdEncoding.DecodeString(n)
		if err != nil {
			usageLine(fs, std, fmt.Sprintf("--b64: NAME %q is not standard base64 (%v)", n, err))
			return nil, false
		}
		out[i] = string(b)
	}
	return out, true
}

// textOutputHelp says how status and list print names, hosts and labels (see display).
const textOutputHelp = `Text output: lock names, hosts and labels are printed as they are, unless they hold a
character that is not printable (a newline, a tab, ESC or another control character, invalid
UTF-8, a Unicode format character), begin or end with a space, or begin with a double
quote: then they are printed Go-quoted, as strconv.Quote does ("orders\n42", "\x1b[31mx",
" x "). So one lock is one line, and a name cannot fake lines of output or hide its spaces.
--json prints them unchanged (JSON-escaped), with "name_b64", the name's exact bytes in
standard base64, beside "name" (a name that is not valid UTF-8 cannot be told from its JSON
string); pass that to --b64 to address the lock.`

// holderAliveHelp says how status and list tell whether a holder's process still runs (see
// holderAlive).
const holderAliveHelp = `Holder process: for a holder on this host (its host name is this machine's), dlock checks
that its process still runs: that a process has its pid (signal 0) and, on Linux, that this
process did not start after the holder did (the start stored with the lock), so a reused pid
does not pass for the holder. A holder in another PID namespace (a container) that has this
host's name is judged by this host's processes, and may be called not running. A holder
whose process is gone (it crashed or was killed) keeps the lock until its lease runs out.`

// serverExitHelp lists the exit codes of status, list and unlock when they cannot do their
// work (run --help has its own, longer table).
const serverExitHelp = `Exit codes: 2 bad command line or --redis URL; 69 the server cannot be reached (or used);
77 access denied: the server refused the login or a command to the user (see "The minimal
ACL rule" in docs/SECURITY.md).`

const jsonFieldsHelp = `
JSON fields (one object per lock):
  name          the lock name (a name that is not valid UTF-8 shows U+FFFD here)
  name_b64      the name's exact bytes in standard base64: give it with --b64 to address
                the lock (status, unlock --force, resize, run)
  held          true while someone holds it
  token         the holder's fencing token; for a free lock the last token while the server
                keeps it (one minute after a release), else 0
  token_time    the server time the token encodes (RFC 3339, UTC): tokens are the server
                clock in microseconds at acquisition unless that was behind the previous
                token, so this is when the lock was acquired (docs/PROTOCOL.md); omitted when
                token is 0
  holds         the holder's hold count (re-entries count); 0 when free
  ttl_ms        the remaining lease in milliseconds; 0 when free
  holder        when held: {"host", "pid", "start" (the holding process's start, RFC 3339),
                "label" (omitted when empty)}, from the description stored with the lock
  holder_alive  whether the holder's process still runs, for a holder on this host (see
                "Holder process" above): true or false; null when it cannot be told, for a
                holder on another host, and for a free lock
  waiters       clients waiting for the lock (entries of its queue on the server; each
                client counts once however many of its goroutines wait); -1 when unknown.
                For a read-write lock or semaphore, the callers in its queue (each counts)
  waiting_goroutines
                goroutines waiting for the lock in those clients, as each reports in its
                queue entry (refreshed every third of a second by default; a client that
                reports no count counts 1); -1 when unknown
  kind          "rwmutex" for a read-write lock, "semaphore" for a semaphore; omitted for a
                lock. Then holder is the writer's or the first holder's, token the writer's
                (without one, the last writer's; a semaphore's first holder's), holds the
                number of holders, and:
  shared        {"size" (semaphore), "size_sticky" (true when dlock resize set the size),
                "permits" (held; readers of a read-write lock),
                "writer", "readers", "queued", "writers_queued", "holders": [{"holder",
                "write", "permits", "holds", "token", "ttl_ms"}, ...]}
  hold_stats    for a lock taken with the adaptive lease (dlock.WithAdaptiveTTL, dlock run
                --adaptive), what the server measured of its holds: {"count", "typical_ms"
                (weighted average, 0.8 × old + 0.2 × new), "high_ms" (high-water mark, fading
                1% per hold), "last_ms", "expires_ms" (the record is dropped after this long
                without a hold)}; omitted when nothing is recorded
  leader        when an election's leader holds the lock ("dlock elect", see "dlock leader"):
                {"value", "value_b64" (its exact bytes, standard base64), "term" (the
                token), "since" (RFC 3339, UTC)}; omitted otherwise`

func runStatus(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("status", "[flags] NAME", `
Show whether the lock NAME is held and, if it is, by whom (host, pid, process start, label),
its fencing token and when it was taken, its hold count, the remaining lease, and how many
clients wait for it, and how many goroutines in them. It exits 0 whether the lock is held or
free. When the lock NAME is free and a read-write lock or semaphore of that name is held (or
known), status shows that instead: its writer or readers, or its permits held and size, each
holder, and the callers queued.

Examples:
  dlock status orders:42
  dlock status --json --redis redis://10.0.0.5:6379/0 nightly-report
  dlock --redis redis://10.0.0.5:6379/0 status nightly-report
  dlock status --b64 //4gc2xvdCA=      (the name of bytes ff fe, then " slot ")

`+holderAliveHelp+`
Then status prints "holder process not running; lock frees in <lease left>" under the holder,
with the reason.

`+textOutputHelp+`
A label is always quoted in status.

`+serverExitHelp+"\n"+jsonFieldsHelp)
	var sf serverFlags
	sf.add(fs)
	asJSON := fs.Bool("json", false, "print one JSON object (fields below)")
	b64 := addB64Flag(fs)
	name, done, code := parseOneName(fs, std, args, b64)
	if done {
		return code
	}
	c, code := sf.dial(ctx, std, "status")
	if c == nil {
		return code
	}
	defer c.Close()
	info, err := c.Inspect(ctx, name)
	if err != nil {
		return report(std, "status", err)
	}
	if *asJSON {
		return printJSON(std, "status", toJSON(info))
	}
	printStatus(std.out, info)
	return exitOK
}

func usageErr(fs *flag.FlagSet, std *stdio, pos []string, want string) int {
	what := "missing lock name"
	if len(pos) > 1 {
		what = fmt.Sprintf("unexpected argument %q after %s", pos[1], want)
	}
	fmt.Fprintf(std.err, "%s: %s\nRun \"%s --help\" for usage.\n", fs.Name(), what, fs.Name())
	return exitUsage
}

func printJSON(std *stdio, cmd string, v any) int {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		fail(std, cmd, err)
		return exitFailure
	}
	fmt.Fprintf(std.out, "%s\n", b)
	return exitOK
}

func printStatus(w io.Writer, i dlock.Info) {
	if i.Shared != nil {
		printSharedStatus(w, i) // a read-write lock or semaphore (shared.go)
		return
	}
	if !i.Held {
		fmt.Fprintf(w, "%s: free\n", display(i.Name))
		if i.Token != 0 {
			fmt.Fprintf(w, "  last token: %d (released within the last minute)\n", i.Token)
		}
		printHolds(w, i.HoldStats)
		return
	}
	fmt.Fprintf(w, "%s: held\n", display(i.Name))
	fmt.Fprintf(w, "  holder:   %s\n", holderText(i.Holder))
	if i.Leader != nil {
		fmt.Fprintf(w, "  leader:   %s (an election's leader: see dlock leader)\n", strconv.Quote(i.Leader.Value))
	}
	if alive, why := holderAlive(i); alive != nil && !*alive {
		fmt.Fprintf(w, "            %s (%s)\n", notRunning(i), why)
	}
	fmt.Fprintf(w, "  acquired: %s (server clock, from the token)\n", i.TokenTime().UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "  token:    %d\n", i.Token)
	fmt.Fprintf(w, "  holds:    %d\n", i.Holds)
	fmt.Fprintf(w, "  lease:    %v left\n", i.TTL)
	fmt.Fprintf(w, "  waiters:  %s\n", waitersDetail(i))
	printHolds(w, i.HoldStats)
}

// printHolds prints what the server measured of an adaptive lock's holds, if anything.
func printHolds(w io.Writer, h dlock.HoldStats) {
	if h.Count == 0 {
		return
	}
	fmt.Fprintf(w, "  holds measured: %d; typical %v, high-water %v, last %v (server clock)\n", h.Count,
		h.Typical.Round(time.Microsecond), h.High.Round(time.Microsecond), h.Last.Round(time.Microsecond))
	fmt.Fprintf(w, "  adaptive lease: %v (3 × the high-water mark, then kept within the lock's min and max); record kept %v more\n",
		h.Lease(0, 1<<62), h.Expires)
}

// notRunning says that the holder of i is gone, and when the lock frees.
func notRunning(i dlock.Info) string {
	return fmt.Sprintf("holder process not running; lock frees in %v", i.TTL)
}

func holderText(h dlock.Holder) string {
	s := fmt.Sprintf("host %s, pid %d", orDash(display(h.Host)), h.PID)
	if !h.Start.IsZero() {
		s += ", process started " + h.Start.UTC().Format(time.RFC3339)
	}
	if h.Label != "" {
		s += fmt.Sprintf(", label %q", h.Label)
	}
	return s
}

func waitersText(n int) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}

// waitersDetail tells waiting clients from their waiting goroutines: "2 clients, 8 goroutines".
func waitersDetail(i dlock.Info) string {
	if i.Waiters < 0 || (i.Waiters == 0 && i.WaitingGoroutines <= 0) {
		return waitersText(i.Waiters)
	}
	s := plural(i.Waiters, "client", "clients")
	if i.WaitingGoroutines >= 0 {
		s += ", " + plural(i.WaitingGoroutines, "goroutine", "goroutines")
	}
	return s
}

// display returns s (a lock name, a holder's host or label: anyone who may write the keys
// chooses them) for text output: as it is when all of it is printable (strconv.IsPrint:
// letters, marks, numbers, punctuation, symbols and the ASCII space) and it does not begin
// with a double quote, else Go-quoted by strconv.Quote ("a\nb", "\x1b[2J", "\u202e"). So one
// lock stays one line, a name cannot move the cursor or fake lines of output, and a quoted
// name never reads as one printed as it is. textOutputHelp tells the user.
func display(s string) string {
	if strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	if first, _ := utf8.DecodeRuneInString(s); unicode.IsSpace(first) {
		return strconv.Quote(s)
	}
	if last, _ := utf8.DecodeLastRuneInString(s); unicode.IsSpace(last) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// listNameWidth is the widest NAME column of dlock list, in characters (runes, as the table's
// alignment counts them).
const listNameWidth = 48

// clip cuts s to width characters, its last one "…", when it is longer.
func clip(s string, width int) string {
	if utf8.RuneCountInString(s) <= width {
		return s
	}
	r := []rune(s)
	return string(r[:width-1]) + "…"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runList(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSet("list", `
List every held lock (or those whose name starts with --name-prefix), sorted by name: name,
token, holds, remaining lease, holder and waiting clients. Held read-write locks and
semaphores are listed too, their HOLDER column saying "rw: N readers", "rw writer HOST:PID"
or "semaphore: HELD/SIZE permits, N holders". A name longer than 48 characters is cut to 47
and "…" in the table (--json has every name whole). It walks the keys with SCAN, never
KEYS, so it does not block the server; locks taken or released during the walk may or may not
appear. On Redis Cluster it lists the node it connects to only.

Two prefixes, not to be confused: --key-prefix is the deployment's, under which all of its
lock keys are (dlock.WithPrefix; "dlock:" unless its programs chose another); --name-prefix
filters the lock names. "dlock list --key-prefix billing: --name-prefix orders:" lists the
locks orders:... of the programs that use dlock.WithPrefix("billing:"), whose keys are
billing:{orders:...}.

Examples:
  dlock list
  dlock list --name-prefix orders: --json

`+holderAliveHelp+`
Then list marks the holder "[not running]".

`+textOutputHelp+`

`+serverExitHelp+"\n"+jsonFieldsHelp+`
With --json the output is one JSON array of such objects ([] when no lock is held).`)
	var sf serverFlags
	sf.add(fs)
	prefix := fs.String("name-prefix", "", "list only the locks whose name starts with this `text` (a filter on names, formerly --prefix; not --key-prefix)")
	addAlias(fs, "prefix", "name-prefix")
	asJSON := fs.Bool("json", false, "print a JSON array (fields below)")
	if done, code := parseFlags(fs, std, args, false); done {
		return code
	}
	c, code := sf.dial(ctx, std, "list")
	if c == nil {
		return code
	}
	defer c.Close()
	infos, err := c.List(ctx, *prefix)
	if err != nil {
		return report(std, "list", err)
	}
	if *asJSON {
		out := make([]jsonInfo, len(infos))
		for i, info := range infos {
			out[i] = toJSON(info)
		}
		return printJSON(std, "list", out)
	}
	if len(infos) == 0 {
		fmt.Fprintln(std.out, "no lock is held")
		return exitOK
	}
	tw := tabwriter.NewWriter(std.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTOKEN\tHOLDS\tLEASE\tHOLDER\tSINCE\tWAITERS\tGOROUTINES")
	for _, i := range infos {
		holder := fmt.Sprintf("%s:%d", orDash(display(i.Holder.Host)), i.Holder.PID)
		if i.Holder.Label != "" {
			holder += " (" + display(i.Holder.Label) + ")"
		}
		if alive, _ := holderAlive(i); alive != nil && !*alive {
			holder += " [not running]"
		}
		if i.Shared != nil {
			holder = sharedHolderColumn(i) // a read-write lock or semaphore (shared.go)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%s\t%s\t%s\t%s\n", clip(display(i.Name), listNameWidth), i.Token, i.Holds, i.TTL, holder,
			i.TokenTime().UTC().Format(time.RFC3339), waitersText(i.Waiters), waitersText(i.WaitingGoroutines))
	}
	tw.Flush()
	return exitOK
}

func runUnlock(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("unlock", "--force NAME", `
Release the lock NAME whoever holds it, as an administrator, as its holder's unlock would: the
first client queued for it gets it, and the next holder's fencing token is larger than the
released one. The holder is not told at once:
its next renewal fails (within a third of its lease, two thirds for an adaptive one) and its
lease context is cancelled then; a holder started with "dlock run" terminates its command and
exits with 76. It prints who held
the lock. When the lock NAME is not held, a held read-write lock or semaphore of that name is
released instead: every holder loses its hold, and the callers queued get it. Exit code 1 when
none was held.

Examples:
  dlock unlock --force orders:42
  dlock unlock --force --b64 //4geCA=    (the name of bytes ff fe, then " x ", from list --json's name_b64)

`+serverExitHelp)
	var sf serverFlags
	sf.add(fs)
	force := fs.Bool("force", false, "required: confirms that the lock is to be taken from its holder")
	b64 := addB64Flag(fs)
	name, done, code := parseOneName(fs, std, args, b64)
	if done {
		return code
	}
	if !*force {
		fmt.Fprintf(std.err, "%s: refusing without --force: it takes the lock from its holder\nRun \"%s --help\" for usage.\n", fs.Name(), fs.Name())
		return exitUsage
	}
	c, code := sf.dial(ctx, std, "unlock")
	if c == nil {
		return code
	}
	defer c.Close()
	info, err := c.ForceUnlock(ctx, name)
	if err != nil {
		return report(std, "unlock", err)
	}
	if info.Shared != nil {
		fmt.Fprintln(std.out, sharedReleased(info)) // a read-write lock or semaphore (shared.go)
		return exitOK
	}
	fmt.Fprintf(std.out, "released %s: it was held by %s (token %d, %s, %v of lease left); %s notified\n",
		display(info.Name), holderText(info.Holder), info.Token, plural(info.Holds, "hold", "holds"), info.TTL,
		plural(info.Waiters, "client", "clients"))
	return exitOK
}
