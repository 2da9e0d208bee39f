package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/redistest"
)

// TestMain doubles as the worker: the end-to-end tests run this test binary again in the
// worker role, as dlock-check runs itself.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "worker" {
		os.Exit(runWorker())
	}
	goleak.VerifyTestMain(m)
}

// resCall sends one request line to the resource server and returns the reply line.
func resCall(t *testing.T, c net.Conn, br *bufio.Reader, line string) string {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	reply, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(reply)
}

func TestResource_FencesReadsAndWrites(t *testing.T) {
	for _, fenced := range []bool{true, false} {
		t.Run(fmt.Sprint("fenced=", fenced), func(t *testing.T) {
			r, err := startResource(fenced, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			c, err := net.Dial("tcp", r.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			want := func(line, reply string) {
				t.Helper()
				if got := resCall(t, c, br, line); got != reply {
					t.Fatalf("%s: got %q, want %q", line, got, reply)
				}
			}
			stale := func(v int) string {
				if fenced {
					return fmt.Sprintf("stale %d 0", v)
				}
				return ""
			}
			want("R 0 1 0 1 5", "ok 0 0")
			want("W 0 1 0 1 5 1", "ok 1 0")
			if fenced {
				want("R 1 1 0 1 4", stale(1)) // an older holder may not even read
				want("W 1 1 0 1 4 7", stale(1))
				want("W 0 1 1 2 5 2", "ok 2 0") // the same token is still the holder's
			} else {
				want("R 1 1 0 1 4", "ok 1 0")
				want("W 1 1 0 1 4 7", "ok 7 0")
			}
			final, ops := r.snapshot()
			if fenced && final != 2 || !fenced && final != 7 {
				t.Fatalf("final value %d", final)
			}
			var staleOps, refused int
			for _, op := range ops {
				if op.Stale {
					staleOps++
				}
				if !op.Accepted {
					refused++
				}
			}
			if staleOps != 2 || (fenced && refused != 2) || (!fenced && refused != 0) {
				t.Fatalf("stale %d, refused %d: %+v", staleOps, refused, ops)
			}
		})
	}
}

// The store rows keep the register in SQLite or Redis, fenced by the library's helpers: the
// resource server answers as it does with its own register, the value and the fence are the
// store's, and where the store's fence decides otherwise than the largest token accepted, the
// server records it.
func TestResource_StoresFenceThroughTheLibrary(t *testing.T) {
	for _, kind := range []storeKind{sqliteStore, redisStore} {
		for _, fenced := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fenced=%v", kind, fenced), func(t *testing.T) {
				st, err := openStore(kind, t.TempDir())
				if errors.Is(err, redistest.ErrNotFound) {
					t.Skip(err)
				}
				if err != nil {
					t.Fatal(err)
				}
				r, err := startResource(fenced, st)
				if err != nil {
					_ = st.close()
					t.Fatal(err)
				}
				closed := false
				defer func() {
					if !closed {
						r.Close()
					}
				}()
				c, err := net.Dial("tcp", r.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				br := bufio.NewReader(c)
				want := func(line, reply string) {
					t.Helper()
					if got := resCall(t, c, br, line); got != reply {
						t.Fatalf("%s: got %q, want %q", line, got, reply)
					}
				}
				want("R 0 1 0 1 5", "ok 0 0")
				want("W 0 1 0 1 5 1", "ok 1 0")
				if fenced {
					want("R 1 1 0 1 4", "stale 1 0") // refused by the store's fence
					want("W 1 1 0 1 4 7", "stale 1 0")
					want("W 0 1 1 2 5 2", "ok 2 0") // the same token is still the holder's
				} else {
					want("R 1 1 0 1 4", "ok 1 0")
					want("W 1 1 0 1 4 7", "ok 7 0")
				}
				v, fence := peekStore(t, st)
				if fenced && (v != 2 || fence != 5) || !fenced && (v != 7 || fence != 0) {
					t.Fatalf("the store holds %d, fence %d", v, fence)
				}
				if fenced {
					// Move the store's fence past every token the server saw: it now refuses
					// the holder's own token, and the server records the disagreement.
					setStoreFence(t, st, 9)
					want("W 0 1 1 3 5 3", "stale 2 0")
					// And back below a stale token, which it then lets through.
					setStoreFence(t, st, 1)
					want("W 1 1 0 2 4 8", "ok 8 0")
				}
				if p := r.storeProblems(); len(p) != 0 {
					t.Fatalf("store problems: %q", p)
				}
				if m := r.fenceMismatches(); fenced && (len(m) != 2 || !strings.Contains(m[0], "refused a token not below the highest seen") || !strings.Contains(m[1], "accepted a token below the highest seen")) || !fenced && len(m) != 0 {
					t.Fatalf("mismatches %q", m)
				}
				r.Close() // reads the final value back from the store
				closed = true
				final, ops := r.snapshot()
				if fenced && final != 8 || !fenced && final != 7 {
					t.Fatalf("final value %d", final)
				}
				var staleOps, refused int
				for _, op := range ops {
					if op.Stale {
						staleOps++
					}
					if !op.Accepted {
						refused++
					}
				}
				if fenced && (staleOps != 3 || refused != 3) || !fenced && (staleOps != 2 || refused != 0) {
					t.Fatalf("stale %d, refused %d: %+v", staleOps, refused, ops)
				}
			})
		}
	}
}

// peekStore reads the register's value and fence in the store directly (a fence never set
// reads 0).
func peekStore(t *testing.T, st registerStore) (v, fence int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch st := st.(type) {
	case *sqliteRegister:
		if err := st.db.QueryRowContext(ctx, `SELECT v, fence FROM register WHERE k = ?`, registerKey).Scan(&v, &fence); err != nil {
			t.Fatal(err)
		}
	case *redisRegister:
		var err error
		if v, err = st.plain.Get(ctx, registerKey).Int64(); err != nil {
			t.Fatal(err)
		}
		fence, err = st.plain.Get(ctx, "{"+registerKey+"}:dlock-fence").Int64()
		if errors.Is(err, redis.Nil) {
			fence, err = 0, nil
		}
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("store %T", st)
	}
	return v, fence
}

// setStoreFence sets the register's fence in the store directly, as a newer holder's write
// would have.
func setStoreFence(t *testing.T, st registerStore, fence int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var err error
	switch st := st.(type) {
	case *sqliteRegister:
		_, err = st.db.ExecContext(ctx, `UPDATE register SET fence = ? WHERE k = ?`, fence, registerKey)
	case *redisRegister:
		err = st.plain.Set(ctx, "{"+registerKey+"}:dlock-fence", fence, 0).Err()
	default:
		t.Fatalf("store %T", st)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestResource_TrapFiresOnceOnTheMatchingRequest(t *testing.T) {
	r, err := startResource(true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	fired := 0
	r.arm(&trap{op: 'W', fire: func(w who, tok uint64) (time.Duration, bool) {
		fired++
		if w != (who{3, 2, 1}) || tok != 9 {
			t.Errorf("fired for %s token %d", w, tok)
		}
		return 0, false
	}})
	resCall(t, c, br, "R 3 2 1 1 9")
	if fired != 0 {
		t.Fatal("a write trap fired on a read")
	}
	resCall(t, c, br, "W 3 2 1 1 9 1")
	resCall(t, c, br, "W 3 2 1 2 9 2")
	if fired != 1 {
		t.Fatalf("fired %d times, want 1", fired)
	}
	r.arm(&trap{op: 'R', fire: func(who, uint64) (time.Duration, bool) { return 250 * time.Millisecond, false }})
	if got := resCall(t, c, br, "R 3 2 1 3 9"); got != "ok 2 250" {
		t.Fatalf("work not handed back: %q", got)
	}
	if r.disarm() {
		t.Fatal("a sprung trap was still armed")
	}
}

// Every part of the checker reads a scenario's row of the table: each row must be complete,
// and a run's limits must come from the flags of its deployment.
func TestScenarioTable(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range scenarios {
		if s.name == "" || s.help == "" {
			t.Errorf("incomplete row: %+v", s)
		}
		// A run whose Dial is refused plays no fault; every other run needs one.
		if hasFault := s.fault.plan != nil && s.fault.inject != nil; hasFault == (s.dialRefused != "") {
			t.Errorf("%s: fault %v with dialRefused %q", s.name, hasFault, s.dialRefused)
		}
		if s.evictsLocks && (!s.forgetsLocks || !s.memory.filler || s.memory.policy == "noeviction") {
			t.Errorf("%s: a server that evicts held locks forgets them, and needs a filler and an evicting policy", s.name)
		}
		if s.outOfMemory && (s.memory.policy != "noeviction" || s.memory.maxmemory == "") {
			t.Errorf("%s: out of memory needs a noeviction server with a limit to set back", s.name)
		}
		if (s.memory.filler || s.outOfMemory) && s.deploy != standalone {
			t.Errorf("%s: memory pressure is played on one standalone server", s.name)
		}
		if seen[s.name] {
			t.Errorf("%s listed twice", s.name)
		}
		seen[s.name] = true
		if got, ok := scenarioNamed(s.name); !ok || got.name != s.name {
			t.Errorf("scenarioNamed(%q) = %v, %v", s.name, got, ok)
		}
		if s.waiterFaults && s.deploy != standalone {
			t.Errorf("%s: grant on release is for one server; quorum mode still races", s.name)
		}
		if s.replicaAck > 0 && s.deploy != sentinelGroup {
			t.Errorf("%s: replica acknowledgement needs replicas", s.name)
		}
		if s.deposes && !s.election {
			t.Errorf("%s: only an election has a leader to depose", s.name)
		}
		if s.persist && (s.deploy != standalone || s.fault.plan == nil) {
			t.Errorf("%s: persistence is played by restarting one standalone server", s.name)
		}
		if s.election && (s.shared != "" || s.accounts > 0 || s.turnSlice > 0 || s.hitsWaiters() || s.deploy == quorum) {
			t.Errorf("%s: an election is a Mutex's lock, with no turns, outside quorum mode, its faults on the leader", s.name)
		}
	}
	if _, ok := scenarioNamed("nonesuch"); ok {
		t.Error("found a scenario that is not in the table")
	}
	o, err := parseFlags(nil, io.Discard)
	if err != nil || strings.Join(o.scenarios, ",") != strings.Join(scenarioNames(), ",") {
		t.Fatalf("default scenarios %v (%v), want the table's %v", o.scenarios, err, scenarioNames())
	}
	o.ttl, o.sentTTL, o.waiterTTL = time.Second, 3*time.Second, 2*time.Second
	o.minFaults, o.sentFaults = 1, 7
	o.maxRun, o.quorumMax = 10*time.Second, 20*time.Second
	for _, c := range []struct {
		name   string
		ttl    time.Duration
		faults int
		maxRun time.Duration
	}{
		{"pause", time.Second, 2, 10 * time.Second}, // one fault of each variant
		{"kill", time.Second, 1, 10 * time.Second},
		{"sentinel-failover-ack", 3 * time.Second, 7, 10 * time.Second},
		{"elect-pause", time.Second, 2, 10 * time.Second}, // one fault of each variant
		{"elect-sentinel-failover-ack", 3 * time.Second, 7, 10 * time.Second},
		{"redlock-restart", time.Second, 1, 20 * time.Second},
		{"eviction", time.Second, 0, 10 * time.Second}, // a refused Dial: no fault
		{"oom", time.Second, 1, 10 * time.Second},
		{"waiter-faults", 2 * time.Second, 3, 10 * time.Second}, // its own TTL; one fault of each variant
		{"sem-frozen-waiters", 2 * time.Second, 2, 10 * time.Second},
		{"rw-frozen-waiters", 2 * time.Second, 2, 10 * time.Second},
	} {
		s, _ := scenarioNamed(c.name)
		if ttl, faults, maxRun := s.ttl(o), s.faults(o), s.deploy.maxRun(o); ttl != c.ttl || faults != c.faults || maxRun != c.maxRun {
			t.Errorf("%s: TTL %v, %d faults, max run %v; want %v, %d, %v", c.name, ttl, faults, maxRun, c.ttl, c.faults, c.maxRun)
		}
	}
	o.minFaults = 5
	if s, _ := scenarioNamed("waiter-faults"); s.faults(o) != 6 {
		t.Errorf("waiter-faults plays %d faults for --min-faults 5, want 6: whole rounds of its variants", s.faults(o))
	}
	if s, _ := scenarioNamed("sem-frozen-waiters"); s.goroutinesPerProcess(o) != frozenGoroutines || s.faults(o) != 6 {
		t.Errorf("sem-frozen-waiters: %d goroutines a process, %d faults for --min-faults 5; want %d, and 6: whole rounds of its variants", s.goroutinesPerProcess(o), s.faults(o), frozenGoroutines)
	}
	both := []bool{true, false}
	for _, s := range scenarios {
		if n := len(s.modes(both)); n != map[bool]int{true: 1, false: 2}[s.dialRefused != "" || s.shared == semLoad] {
			t.Errorf("%s runs in %d modes", s.name, n)
		}
	}
}

// history builders for the analysis tests. Times are in ms for readability; the analysis only
// compares them. Tokens are small, so they map outside the Lock calls and the grant instants
// fall back to the calls' bounds.
type hist struct {
	d *runData
}

func newHist(scenario string, fenced bool) *hist {
	return &hist{d: &runData{conf: runConf{Scenario: scenario, Fenced: fenced, TTL: 500 * time.Millisecond}}}
}

func msT(v float64) int64 { return int64(v * 1e6) }

// Participants of the analysis tests: the first goroutine of workers 0 and 1 (incarnation 1),
// and the second goroutine of worker 0.
var (
	w0  = who{0, 1, 0}
	w1  = who{1, 1, 0}
	w0b = who{0, 1, 1}
)

func (h *hist) acq(w who, tok uint64, s, r float64) {
	h.d.events = append(h.d.events, event{K: "acq", Slot: w.Slot, Inc: w.Inc, G: w.G, Tok: tok, S: msT(s), R: msT(r), Res: "ok"})
}

func (h *hist) chk(w who, tok uint64, at float64, live bool) {
	h.d.events = append(h.d.events, event{K: "chk", Slot: w.Slot, Inc: w.Inc, G: w.G, Tok: tok, S: msT(at), Live: live})
}

func (h *hist) sig(w who, tok uint64, at float64) {
	h.d.events = append(h.d.events, event{K: "sig", Slot: w.Slot, Inc: w.Inc, G: w.G, Tok: tok, S: msT(at), Cause: "done"})
}

func (h *hist) unl(w who, tok uint64, s, r float64) {
	h.d.events = append(h.d.events, event{K: "unl", Slot: w.Slot, Inc: w.Inc, G: w.G, Tok: tok, S: msT(s), R: msT(r)})
}

// rmw is a read at [rs, rs+1] (applied at rs+0.5) and, if ws > 0, a write at [ws, ws+1].
func (h *hist) rmw(w who, tok uint64, seq int64, val int64, rs, ws float64, accepted bool) {
	h.d.events = append(h.d.events, event{K: "rd", Slot: w.Slot, Inc: w.Inc, G: w.G, Tok: tok, Seq: seq, S: msT(rs), R: msT(rs + 1), Val: val, Res: "ok"})
	h.d.ops = append(h.d.ops, opRecord{T: msT(rs + 0.5), Op: 'R', Slot: w.Slot, Inc: w.Inc, G: w.G, Seq: seq, Token: tok, Value: val, Accepted: true})
	if ws == 0 {
		return
	}
	h.write(w, tok, seq, val+1, ws, accepted)
}

// write is a write of val at [ws, ws+1] (applied at ws+0.5).
func (h *hist) write(w who, tok uint64, seq int64, val int64, ws float64, accepted bool) {
	res := "ok"
	if !accepted {
		res = "stale"
	}
	h.d.events = append(h.d.events, event{K: "wr", Slot: w.Slot, Inc: w.Inc, G: w.G, Tok: tok, Seq: seq, S: msT(ws), R: msT(ws + 1), Val: val, Res: res})
	h.d.ops = append(h.d.ops, opRecord{T: msT(ws + 0.5), Op: 'W', Slot: w.Slot, Inc: w.Inc, G: w.G, Seq: seq, Token: tok, Value: val, Accepted: accepted})
	if accepted {
		h.d.final = val
	}
}

func TestAnalyze_MutualExclusionIsCleanAndLinearizable(t *testing.T) {
	h := newHist("pause", true)
	h.acq(w0, 10, 0, 1)
	h.chk(w0, 10, 2, true)
	h.rmw(w0, 10, 1, 0, 3, 5, true)
	h.acq(w1, 11, 1, 8) // waited, granted after 0's unlock at ~7
	h.chk(w1, 11, 9, true)
	h.rmw(w1, 11, 1, 1, 10, 12, true)
	f := analyze(h.d, 10*time.Second)
	if len(f.Failures) != 0 || f.Overlaps != 0 || f.LostUpdates != 0 || f.Linearizable != porcupine.Ok || f.Cycles != 2 || f.Ops != 4 {
		t.Fatalf("%+v", f)
	}
}

// The classic lost update: A reads, is paused, B takes the lock, reads and writes, A wakes
// and writes the value it read plus one.
func pausedWriterHistory(fenced bool) *hist {
	h := newHist("pause", fenced)
	h.acq(w0, 10, 0, 1)
	h.chk(w0, 10, 2, true)
	h.rmw(w0, 10, 1, 0, 3, 0, false)
	h.acq(w1, 11, 1, 600)
	h.chk(w1, 11, 601, true)
	h.rmw(w1, 11, 1, 0, 602, 604, true)
	// A's write lands after B's, with its old token.
	h.d.events = append(h.d.events, event{K: "wr", Slot: 0, Inc: 1, Tok: 10, Seq: 1, S: msT(4), R: msT(700), Val: 1, Res: map[bool]string{true: "stale", false: "ok"}[fenced]})
	h.d.ops = append(h.d.ops, opRecord{T: msT(699), Op: 'W', Slot: 0, Inc: 1, Seq: 1, Token: 10, Value: 1, Accepted: !fenced, Stale: true})
	h.d.final = 1
	h.sig(w0, 10, 701)
	h.d.faults = []faultRec{{Kind: "pause", Slot: 0, Inc: 1, Token: 10, Start: msT(3.5), End: msT(698)}}
	return h
}

func TestAnalyze_UnfencedLostUpdateIsMeasuredNotFailed(t *testing.T) {
	f := analyze(pausedWriterHistory(false).d, 10*time.Second)
	if f.LostUpdates != 1 || f.Overlaps != 1 || f.StaleLanded != 1 || f.Linearizable != porcupine.Illegal {
		t.Fatalf("lost %d overlaps %d stale landed %d linearizable %s", f.LostUpdates, f.Overlaps, f.StaleLanded, f.Linearizable)
	}
	if len(f.Failures) != 0 {
		t.Fatalf("unfenced lost updates must not fail the run: %v", f.Failures)
	}
	if f.SignalsLate != 1 || len(f.Recovery) != 1 || f.Recovery[0] != 600*time.Millisecond-3500*time.Microsecond {
		t.Fatalf("late signals %d, recovery %v", f.SignalsLate, f.Recovery)
	}
}

func TestAnalyze_FencedStaleWriteIsRefused(t *testing.T) {
	h := pausedWriterHistory(true)
	h.d.final = 1
	f := analyze(h.d, 10*time.Second)
	if f.LostUpdates != 0 || f.StaleRejected != 1 || f.Linearizable != porcupine.Ok || len(f.Failures) != 0 {
		t.Fatalf("%+v", f)
	}
}

func TestAnalyze_FencedLostUpdateFails(t *testing.T) {
	h := pausedWriterHistory(true)
	// Pretend the fence let the late write through.
	for i := range h.d.ops {
		h.d.ops[i].Accepted = true
	}
	f := analyze(h.d, 10*time.Second)
	if len(f.Failures) != 2 || !strings.Contains(f.Failures[0], "1 lost updates") || !strings.Contains(f.Failures[1], "not linearizable") {
		t.Fatalf("failures: %q", f.Failures)
	}
}

// A store row's fence (package fence, the Client's fenced operations) must decide every request
// as a fence of the largest token accepted would: a disagreement the resource server recorded
// fails a fenced run, even when no update was lost.
func TestAnalyze_StoreFenceMismatchFails(t *testing.T) {
	h := pausedWriterHistory(true)
	h.d.conf.Scenario = "pause-sql"
	h.d.fenceMismatches = []string{"W by worker 1.1 g0 token 11 (highest seen 11): the store's fence refused a token not below the highest seen"}
	f := analyze(h.d, 10*time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "store (sqlite) decided 1 requests otherwise") || f.LostUpdates != 0 {
		t.Fatalf("failures %q, lost %d", f.Failures, f.LostUpdates)
	}
}

func TestAnalyze_LiveContextAfterTheNextGrantFails(t *testing.T) {
	h := newHist("partition", true)
	h.acq(w0, 10, 0, 1)
	h.acq(w1, 11, 1, 600)
	h.chk(w0, 10, 599, true) // during 1's Lock call: cannot tell
	h.chk(w0, 10, 650, true) // after it returned: the context lied
	h.sig(w0, 10, 660)
	h.d.faults = []faultRec{{Kind: "partition", Slot: 0, Inc: 1, Token: 10, Start: msT(2)}}
	f := analyze(h.d, time.Second)
	if f.LiveAfterNext != 1 || f.UnsureLive != 1 || f.SignalsAfter != 1 || len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "token 10 context live") {
		t.Fatalf("live after %d, unsure %d, signals after %d, failures %q", f.LiveAfterNext, f.UnsureLive, f.SignalsAfter, f.Failures)
	}
	// In the restart scenario the server forgets the lock: measured, not failed.
	h.d.conf.Scenario = "restart"
	h.d.faults = nil
	if f := analyze(h.d, time.Second); len(f.Failures) != 0 || f.LiveAfterNext != 1 {
		t.Fatalf("restart: %q", f.Failures)
	}
}

func TestAnalyze_MissingSignalAndSlowRecoveryFail(t *testing.T) {
	h := newHist("partition", false)
	h.acq(w0, 10, 0, 1)
	h.acq(w1, 11, 1, 600)
	h.d.faults = []faultRec{{Kind: "partition", Slot: 0, Inc: 1, Token: 10, Start: msT(2)}}
	if f := analyze(h.d, time.Second); len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "never got a lost-lock signal") {
		t.Fatalf("failures: %q", f.Failures)
	}
	h = newHist("kill", false)
	h.acq(w0, 10, 0, 1)
	h.acq(w1, 11, 1, 802)
	h.d.faults = []faultRec{{Kind: "kill", Slot: 0, Inc: 1, Token: 10, Start: msT(2)}} // 800 ms before the next grant
	if f := analyze(h.d, time.Second); len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "over TTL + 250 ms") {
		t.Fatalf("failures: %q", f.Failures)
	}
}

func TestAnalyze_TokensMustIncrease(t *testing.T) {
	h := newHist("latency", true)
	h.acq(w0, 20, 0, 1)
	h.acq(w1, 11, 5, 6) // started after 20 was handed out, yet smaller
	if f := analyze(h.d, time.Second); f.TokenOrderBugs != 1 || len(f.Failures) != 1 {
		t.Fatalf("token order bugs %d, failures %q", f.TokenOrderBugs, f.Failures)
	}
}

// Goroutines of one worker process are separate clients: two of them interleaving their
// read-modify-writes (the same cycle numbers, one process) is an overlap, a lost update and a
// history porcupine rejects, exactly as between two processes.
func TestAnalyze_GoroutinesOfOneProcessAreSeparateClients(t *testing.T) {
	h := newHist("pause", false)
	h.acq(w0, 10, 0, 1)
	h.chk(w0, 10, 2, true)
	h.rmw(w0, 10, 1, 0, 3, 0, false) // reads 0...
	h.acq(w0b, 30, 1, 600)
	h.chk(w0b, 30, 601, true)
	h.rmw(w0b, 30, 1, 0, 602, 604, true) // ...so does its sibling, which writes 1...
	h.write(w0, 10, 1, 1, 700, true)     // ...and the first writes 1 again, late
	h.d.ops[len(h.d.ops)-1].Stale = true // (its token is below the sibling's)
	f := analyze(h.d, 10*time.Second)
	if f.Overlaps != 1 || f.LostUpdates != 1 || f.StaleLanded != 1 || f.Linearizable != porcupine.Illegal {
		t.Fatalf("overlaps %d, lost %d, stale landed %d, %s: want 1, 1, 1, Illegal", f.Overlaps, f.LostUpdates, f.StaleLanded, f.Linearizable)
	}
	if len(f.Failures) != 0 || f.LocalHandoffs != 0 {
		t.Fatalf("failures %q, local handoffs %d", f.Failures, f.LocalHandoffs)
	}
	// The same history fenced: the late write is refused and nothing is lost.
	h.d.conf.Fenced = true
	h.d.ops[len(h.d.ops)-1].Accepted = false
	h.d.events[len(h.d.events)-1].Res = "stale"
	h.d.final = 1
	if f := analyze(h.d, 10*time.Second); f.LostUpdates != 0 || f.StaleRejected != 1 || f.Linearizable != porcupine.Ok || len(f.Failures) != 0 {
		t.Fatalf("fenced: lost %d, stale refused %d, %s, failures %q", f.LostUpdates, f.StaleRejected, f.Linearizable, f.Failures)
	}
}

// A local handoff: the holder's Unlock passes the lock to its sibling goroutine with token + 1.
// The analysis counts it, and places its grant inside the Unlock call: mapped as a server token
// (the clock) it would land at the first holder's own grant, and every later check of that
// holder would look like "held after the next grant".
func TestAnalyze_LocalHandoffGrantedInsideUnlock(t *testing.T) {
	h := newHist("pause", true)
	// Tokens are µs of the wall clock; with this sample, wall clock = CLOCK_MONOTONIC.
	h.d.clocks = []clockSample{{mono: 0, real: 0}}
	h.acq(w0, 500, 0, 1) // granted by the server at 0.5 ms
	h.chk(w0, 500, 2, true)
	h.rmw(w0, 500, 1, 0, 3, 5, true)
	h.chk(w0, 500, 5.9, true)
	h.unl(w0, 500, 6, 7)
	h.acq(w0b, 501, 0.2, 8) // queued behind it since 0.2 ms; 501 µs would map inside its call
	h.chk(w0b, 501, 9, true)
	h.rmw(w0b, 501, 1, 1, 10, 12, true)
	h.unl(w0b, 501, 13, 13.5)
	h.acq(w1, 14001, 2, 15) // another process, from the server
	h.chk(w1, 14001, 16, true)
	h.rmw(w1, 14001, 1, 2, 17, 19, true)
	h.unl(w1, 14001, 20, 20.5)
	h.acq(who{2, 1, 0}, 14002, 21, 25) // token + 1, but another process: not a local handoff
	f := analyze(h.d, 10*time.Second)
	if f.LocalHandoffs != 1 || f.LiveAfterNext != 0 || f.UnsureLive != 0 || len(f.Failures) != 0 {
		t.Fatalf("local handoffs %d, live after next %d, unsure %d, failures %q: want 1, 0, 0, none",
			f.LocalHandoffs, f.LiveAfterNext, f.UnsureLive, f.Failures)
	}
	// A token the process made in between and nobody held (a lock parked at the Unlock, then
	// handed on at the turn's end) leaves a gap: still a local handoff, granted inside the Unlock.
	g := newHist("pause", true)
	g.d.clocks = []clockSample{{mono: 0, real: 0}}
	g.acq(w0, 500, 0, 1)
	g.chk(w0, 500, 2, true)
	g.rmw(w0, 500, 1, 0, 3, 5, true)
	g.chk(w0, 500, 5.9, true)
	g.unl(w0, 500, 6, 7)
	g.acq(w0b, 502, 0.2, 6.5) // 501 was parked and never held
	g.chk(w0b, 502, 9, true)
	if f := analyze(g.d, 10*time.Second); f.LocalHandoffs != 1 || f.LiveAfterNext != 0 || len(f.Failures) != 0 {
		t.Fatalf("with a gap: local handoffs %d, live after next %d, failures %q: want 1, 0, none",
			f.LocalHandoffs, f.LiveAfterNext, f.Failures)
	}
	// A check of the first holder after its Unlock returned (impossible in a worker, which
	// stops checking once it unlocks) would be one after the handoff.
	h.chk(w0, 500, 7.5, true)
	if f := analyze(h.d, 10*time.Second); f.LiveAfterNext != 1 || len(f.Failures) != 1 {
		t.Fatalf("live after next %d, failures %q: want 1, 1", f.LiveAfterNext, f.Failures)
	}
}

// ev appends a raw event of w.
func (h *hist) ev(w who, e event) {
	e.Slot, e.Inc, e.G = w.Slot, w.Inc, w.G
	h.d.events = append(h.d.events, e)
}

// dialled logs the start and Dial of w's process: refused with the errKind is, or, when is is
// "", a success followed by the warning an unsafe client logs.
func (h *hist) dialled(w who, is string) {
	h.ev(w, event{K: "start", S: 0})
	if is != "" {
		h.ev(w, event{K: "dial", Res: "err: dlock: server may evict lock keys", Is: is})
		return
	}
	h.ev(w, event{K: "dial", Res: "ok"})
	h.ev(w, event{K: "log", Res: "level=WARN msg=\"dlock: server may evict lock keys; going on as WithUnsafeEviction allows\""})
}

// The default Dial against an evicting server: the run passes when every worker's Dial was
// refused with ErrEvictionPolicy and nothing ran, and fails otherwise.
func TestAnalyze_EvictionDialRefused(t *testing.T) {
	refused := func() *hist {
		h := newHist("eviction", true)
		h.d.conf.Workers = 2
		h.dialled(w0, errKindEvictionPolicy)
		h.dialled(w1, errKindEvictionPolicy)
		return h
	}
	f := analyze(refused().d, time.Second)
	if len(f.Failures) != 0 || f.Dials != 2 || f.DialsRefused != 2 || f.Mode != "dial-only" {
		t.Fatalf("failures %q, %d of %d dials refused, mode %s", f.Failures, f.DialsRefused, f.Dials, f.Mode)
	}
	if cell := memoryCell(f); !strings.Contains(cell, "2 of 2 Dials refused with ErrEvictionPolicy") {
		t.Fatalf("memory cell %q", cell)
	}

	// One worker got through and ran a cycle.
	h := refused()
	h.d.events = h.d.events[:2]
	h.dialled(w1, "")
	h.acq(w1, 10, 5, 6)
	h.rmw(w1, 10, 1, 0, 7, 9, true)
	f = analyze(h.d, time.Second)
	if len(f.Failures) != 2 || !strings.Contains(f.Failures[0], "1 of 2 Dials not refused with an error wrapping ErrEvictionPolicy: worker 1.1: Dial succeeded") ||
		!strings.Contains(f.Failures[1], "1 acquisitions were attempted and 2 register operations ran") {
		t.Fatalf("failures %q", f.Failures)
	}

	// Refused, but for another reason; and a worker that never dialled.
	h = refused()
	h.d.events[1].Is, h.d.events[1].Res = "", "err: dial tcp: connection refused"
	h.d.conf.Workers = 3
	f = analyze(h.d, time.Second)
	if len(f.Failures) != 2 || !strings.Contains(f.Failures[0], "Dial failed otherwise: err: dial tcp") ||
		!strings.Contains(f.Failures[1], "2 worker processes started, 2 logged a Dial; want 3") {
		t.Fatalf("failures %q", f.Failures)
	}
}

// evictedHistory is pausedWriterHistory in the eviction-unsafe scenario: the server evicted the
// lock's key at 300 ms, while worker 0 held it; worker 1 took it, and worker 0's late write
// came after worker 1's.
func evictedHistory(fenced bool) *hist {
	h := pausedWriterHistory(fenced)
	h.d.conf.Scenario = "eviction-unsafe"
	h.dialled(w0, "")
	h.dialled(w1, "")
	h.d.faults[0].Kind = "eviction-unsafe"
	h.d.mem = memRecord{EvictedKeys: 40, FillerKeys: 100, LockEvictions: []int64{msT(300)}}
	h.d.end = msT(800)
	return h
}

// With WithUnsafeEviction the lost update of a lock whose key was evicted is counted, not
// failed, unfenced; fenced the fence must still hold. The run fails when no lock key was
// evicted under a holder (it proves nothing), and when the client did more than warn.
func TestAnalyze_UnsafeEvictionCountsLostUpdates(t *testing.T) {
	f := analyze(evictedHistory(false).d, 10*time.Second)
	if len(f.Failures) != 0 {
		t.Fatalf("unfenced lost updates after an eviction must not fail the run: %q", f.Failures)
	}
	if f.LostUpdates != 1 || f.Overlaps != 1 || f.LockEvictions != 1 || f.LockEvictionsHeld != 1 || f.Warnings != 2 || f.EvictedKeys != 40 {
		t.Fatalf("lost %d, overlaps %d, lock evictions %d (%d held), warnings %d, evicted %d", f.LostUpdates, f.Overlaps, f.LockEvictions, f.LockEvictionsHeld, f.Warnings, f.EvictedKeys)
	}
	if cell := memoryCell(f); cell != "evicted 40 keys, the lock's 1 times (1 under a holder); 2 warnings" {
		t.Fatalf("memory cell %q", cell)
	}
	// The clients warned only when they dialled: noted.
	if !slices.ContainsFunc(f.Notes, func(n string) bool { return strings.Contains(n, "warned when they dialled and never again") }) {
		t.Fatalf("notes %q", f.Notes)
	}

	// Fenced, the late write is refused...
	if f := analyze(evictedHistory(true).d, 10*time.Second); len(f.Failures) != 0 || f.LostUpdates != 0 || f.StaleRejected != 1 {
		t.Fatalf("fenced: failures %q, lost %d, refused %d", f.Failures, f.LostUpdates, f.StaleRejected)
	}
	// ...and a fence that let it through fails the run, eviction or not.
	h := evictedHistory(true)
	for i := range h.d.ops {
		h.d.ops[i].Accepted = true
	}
	if f := analyze(h.d, 10*time.Second); len(f.Failures) != 2 || !strings.Contains(f.Failures[0], "fenced: 1 lost updates") {
		t.Fatalf("fenced, fence broken: failures %q", f.Failures)
	}

	// The lock's key evicted only between holders: the run proves nothing.
	h = evictedHistory(false)
	h.d.mem.LockEvictions = []int64{msT(0.5)}
	if f := analyze(h.d, 10*time.Second); len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "never evicted while a lease on it was held") {
		t.Fatalf("no eviction under a holder: failures %q", f.Failures)
	}

	// The opted-in client ended a lease and refused an acquisition for the eviction policy.
	h = evictedHistory(false)
	for i, e := range h.d.events {
		if e.K == "sig" {
			h.d.events[i].Is = errKindLost + "," + errKindEvictionPolicy
		}
	}
	h.ev(w1, event{K: "acq", S: msT(610), R: msT(611), Res: "err: dlock: lock: server may evict lock keys", Is: errKindEvictionPolicy})
	f = analyze(h.d, 10*time.Second)
	if len(f.Failures) != 2 || !strings.Contains(f.Failures[0], "1 acquisitions refused for the eviction policy") || !strings.Contains(f.Failures[1], "1 leases ended for the eviction policy") {
		t.Fatalf("client did more than warn: failures %q", f.Failures)
	}
}

// oomHistory: the server is out of memory from 100 to 1300 ms. Worker 0 unlocks inside it, and
// the key then reads released; worker 1's two attempts are refused with ErrOutOfMemory, and the
// server grants it the lock 20 ms after memory is back.
func oomHistory() *hist {
	h := newHist("oom", true)
	h.acq(w0, 10, 0, 1)
	h.chk(w0, 10, 2, true)
	h.rmw(w0, 10, 1, 0, 3, 5, true)
	h.d.faults = []faultRec{{Kind: "oom", Slot: 0, Inc: 1, Token: 10, Start: msT(100), End: msT(1300)}}
	h.unl(w0, 10, 200, 201)
	h.ev(w0, event{K: "key", S: msT(201.5), R: msT(202), Tok: 10, Live: true, Res: "- 10 0"})
	for _, at := range []float64{300, 700} {
		h.ev(w1, event{K: "acq", S: msT(at), R: msT(at + 1), Res: "err: dlock: lock \"x\" on 127.0.0.1:1: dlock: server out of memory: ...", Is: errKindOutOfMemory})
	}
	h.acq(w1, 40, 1310, 1320)
	h.chk(w1, 40, 1321, true)
	h.rmw(w1, 40, 1, 1, 1322, 1324, true)
	return h
}

func TestAnalyze_OutOfMemory(t *testing.T) {
	f := analyze(oomHistory().d, 10*time.Second)
	if len(f.Failures) != 0 || f.OOMRefused != 2 || f.OOMReleases != 1 || f.OOMReleased != 1 || f.OOMGrants != 0 {
		t.Fatalf("failures %q, refused %d, releases %d (released %d), grants %d", f.Failures, f.OOMRefused, f.OOMReleases, f.OOMReleased, f.OOMGrants)
	}
	// Recovery runs from memory back (1300 ms) to the next grant by the server.
	if len(f.Recovery) != 1 || f.Recovery[0] != 20*time.Millisecond {
		t.Fatalf("recovery %v", f.Recovery)
	}
	if cell := memoryCell(f); !strings.Contains(cell, "2 acquisitions refused (ErrOutOfMemory), 0 granted (0 by a release); 1 Unlocks ok, then released 1") {
		t.Fatalf("memory cell %q", cell)
	}

	// The key still holds worker 0's lease after its Unlock returned nil...
	stillHeld := func(h *hist) {
		for i, e := range h.d.events {
			if e.K == "key" {
				h.d.events[i].Res = `owner0 10 1 {"pid":1,}`
			}
		}
	}
	h := oomHistory()
	stillHeld(h)
	if f := analyze(h.d, 10*time.Second); len(f.Failures) != 2 || !strings.Contains(f.Failures[0], "returned nil but left the lock held: worker 0.1 g0 token 10") ||
		!strings.Contains(f.Failures[1], "no Unlock released the lock on the server") {
		t.Fatalf("held after Unlock: failures %q", f.Failures)
	}
	// ...or when it passed the lock to a sibling whose Lock call failed at that moment (its
	// attempt refused for memory), which released the lease it was handed.
	h = oomHistory()
	stillHeld(h)
	h.ev(w0b, event{K: "acq", S: msT(150), R: msT(203), Res: "err: dlock: server out of memory", Is: errKindOutOfMemory})
	if f := analyze(h.d, 10*time.Second); len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "no Unlock released the lock on the server") ||
		f.OOMPassedBack != 1 || f.OOMPassedOn != 1 {
		t.Fatalf("passed back: failures %q, passed on %d (back %d)", f.Failures, f.OOMPassedOn, f.OOMPassedBack)
	}
	// ...which is right when the Unlock passed the lock to a sibling goroutine, whose release
	// then reached the server.
	h = oomHistory()
	stillHeld(h)
	h.acq(w0b, 11, 150, 200.5) // inside worker 0's Unlock: a local handoff
	h.chk(w0b, 11, 210, true)
	h.rmw(w0b, 11, 2, 1, 211, 213, true)
	h.unl(w0b, 11, 220, 221)
	h.ev(w0b, event{K: "key", S: msT(222), R: msT(223), Tok: 11})
	h.d.events = slices.DeleteFunc(h.d.events, func(e event) bool { return e.K == "rd" && e.Tok == 40 })
	h.d.ops = slices.DeleteFunc(h.d.ops, func(op opRecord) bool { return op.Token == 40 })
	h.rmw(w1, 40, 1, 2, 1322, 1324, true)
	f = analyze(h.d, 10*time.Second)
	if len(f.Failures) != 0 || f.LocalHandoffs != 1 || f.OOMReleases != 2 || f.OOMPassedOn != 1 || f.OOMReleased != 1 {
		t.Fatalf("passed on: failures %q, local handoffs %d, releases %d (passed on %d, released %d)", f.Failures, f.LocalHandoffs, f.OOMReleases, f.OOMPassedOn, f.OOMReleased)
	}

	// An Unlock that fails under OOM, a grant by the server and an OOM refusal that does not
	// wrap ErrOutOfMemory.
	h = oomHistory()
	h.unl(w1, 27, 500, 505)
	h.d.events[len(h.d.events)-1].Res = "dlock: unlock \"x\": OOM command not allowed when used memory > 'maxmemory'"
	h.acq(w0, 27, 400, 420) // from the server: 16 past the process's last token, as acquire.lua makes them
	h.ev(w1, event{K: "acq", S: msT(800), R: msT(801), Res: "err: OOM command not allowed when used memory > 'maxmemory'"})
	f = analyze(h.d, 10*time.Second)
	if len(f.Failures) != 3 || !strings.Contains(f.Failures[0], "1 Unlocks failed while the server was out of memory: worker 1.1 g0 token 27") ||
		!strings.Contains(f.Failures[1], "granted the lock 1 times while out of memory, not by a release: worker 0.1 g0 token 27 at t+0.400s") ||
		!strings.Contains(f.Failures[2], "1 acquisitions refused for memory with an error that does not wrap ErrOutOfMemory") {
		t.Fatalf("failed Unlock, grant, unmarked refusal: failures %q", f.Failures)
	}

	// A grant made by a release (grant on release): worker 0's Unlock under OOM gives the lock
	// to worker 1, queued; the key then reads held by worker 1's token. Counted, not failed.
	h = oomHistory()
	for i, e := range h.d.events {
		if e.K == "key" {
			h.d.events[i].Res = `owner1 20 1 {"pid":2,}`
		}
	}
	h.acq(w1, 20, 150, 200.8) // its grant instant is bounded by the Lock call: 150 to 200.8 ms
	h.d.events[len(h.d.events)-1].S = msT(200.2)
	h.d.events[len(h.d.events)-1].R = msT(200.8)
	h.unl(w1, 20, 250, 251)
	f = analyze(h.d, 10*time.Second)
	if len(f.Failures) != 0 || f.OOMGrants != 1 || f.OOMGrantsOnRelease != 1 || f.OOMTakenAgain != 1 {
		t.Fatalf("grant on release: failures %q, grants %d (%d by a release), taken again %d", f.Failures, f.OOMGrants, f.OOMGrantsOnRelease, f.OOMTakenAgain)
	}

	// A lease granted while out of memory that its client already counts as lost (its context
	// said so at its first check): its Unlock returns ErrLost, with nothing to release. Noted;
	// the same Unlock without the loss reported before it fails.
	lostLease := func(told bool) *findings {
		h := oomHistory()
		h.acq(w1, 20, 200.2, 200.8) // granted by worker 0's release
		if told {
			h.sig(w1, 20, 201)
		}
		h.unl(w1, 20, 401, 402)
		h.d.events[len(h.d.events)-1].Res = `dlock: lock lost: "x" was lost before Unlock (dlock: not held)`
		h.d.events[len(h.d.events)-1].Is = errKindLost
		return analyze(h.d, 10*time.Second)
	}
	if f := lostLease(true); len(f.Failures) != 0 || f.OOMLostBefore != 1 {
		t.Fatalf("lost before Unlock: failures %q, lost before %d", f.Failures, f.OOMLostBefore)
	}
	if f := lostLease(false); len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "1 Unlocks failed while the server was out of memory") {
		t.Fatalf("lost at Unlock: failures %q", f.Failures)
	}

	// Nothing refused, no release on the server, no grant by the server after memory is back:
	// the run proves nothing, and the lock did not come back.
	h = newHist("oom", true)
	h.acq(w0, 10, 0, 1)
	h.acq(w0b, 11, 1, 1400) // a local handoff from worker 0 (its Unlock is unknown here)
	h.d.faults = []faultRec{{Kind: "oom", Slot: 0, Inc: 1, Token: 10, Start: msT(100), End: msT(1300)}}
	f = analyze(h.d, 10*time.Second)
	if len(f.Failures) != 3 || !strings.Contains(f.Failures[0], "granted the lock to no one after memory was back") ||
		!strings.Contains(f.Failures[1], "no acquisition was refused with ErrOutOfMemory") || !strings.Contains(f.Failures[2], "no Unlock released the lock on the server") {
		t.Fatalf("proves nothing: failures %q", f.Failures)
	}
}

// A waiter fault's schedule: each variant in turn, the pauses on the right side of the
// acceptance window and of the TTL.
func TestPlanWaiter(t *testing.T) {
	ttl := 2 * time.Second
	win := acceptWindow(ttl)
	sch := newSchedule(runConf{Scenario: "waiter-faults", Seed: 7})
	for n := range 30 {
		p := sch.next(hitWaiter, ttl)
		switch want := waiterVariants[n%len(waiterVariants)]; {
		case p.variant != want:
			t.Fatalf("fault %d: variant %q, want %q", n, p.variant, want)
		case want == "stop-past-window" && (p.dur <= win+waiterPauseMargin/2 || p.dur >= ttl-waiterPauseMargin/2):
			t.Fatalf("fault %d: pause %v, want past the window %v and short of the TTL %v", n, p.dur, win, ttl)
		case want == "stop-past-ttl" && p.dur <= ttl:
			t.Fatalf("fault %d: pause %v, want past the TTL %v", n, p.dur, ttl)
		case want == "kill" && p.dur != 0:
			t.Fatalf("fault %d: kill with a pause of %v", n, p.dur)
		}
	}
	if win != time.Second || acceptWindow(500*time.Millisecond) != 500*time.Millisecond {
		t.Fatalf("acceptance window %v for 2 s, %v for 500 ms", win, acceptWindow(500*time.Millisecond))
	}
	if _, err := parseFlags([]string{"--waiter-ttl", "1s"}, io.Discard); err == nil {
		t.Fatal("--waiter-ttl 1s accepted: no pause fits between a 1 s window and a 1 s TTL")
	}
}

// waiterHistory is a waiter fault at 100 ms on worker 1 (client "c1"), which the server
// granted the lock to at 105 ms (token 20), while worker 0's goroutines waited; worker 0 gets
// the lock back after gap ms more.
func waiterHistory(gap float64, granted bool) *hist {
	h := newHist("waiter-faults", true)
	h.d.conf.TTL = 2 * time.Second
	h.acq(w0, 10, 0, 1)
	h.unl(w0, 10, 104, 105)
	h.acq(w0b, 30, 50, 105+gap)
	h.d.faults = []faultRec{{Kind: "waiter-faults", Variant: "kill", Slot: 0, Inc: 1, Token: 10, Start: msT(100), End: msT(101),
		Waiter: &waiterHit{Slot: 1, Inc: 1, PID: 42, Entry: "c1.7", Queue: 1}}}
	if granted {
		h.d.announcements = []announcement{{T: msT(105), Payload: "g 20 c1.7 1000"}, {T: msT(105 + gap), Payload: "g 30 c0.3 1000"}}
	}
	return h
}

func TestAnalyze_WaiterFaultStall(t *testing.T) {
	// The dead waiter's window (1 s) runs out, and the other process gets the lock.
	f := analyze(waiterHistory(1010, true).d, time.Second)
	if len(f.Failures) != 0 || f.WaiterGranted != 1 || len(f.Recovery) != 1 || f.Recovery[0] != time.Duration(msT(1015)) {
		t.Fatalf("failures %q, granted %d, stalls %v", f.Failures, f.WaiterGranted, f.Recovery)
	}
	if !slices.ContainsFunc(f.Notes, func(n string) bool {
		return strings.Contains(n, "over the acceptance window 1s + 250 ms after 0 of them")
	}) {
		t.Fatalf("notes: %q", f.Notes)
	}
	// Over the window + TTL (3 s): the queue stalled.
	f = analyze(waiterHistory(3100, true).d, time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "the queue stalled") {
		t.Fatalf("failures %q", f.Failures)
	}
	// No grant to the hit waiter: the run proves nothing.
	f = analyze(waiterHistory(1010, false).d, time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "proves nothing") {
		t.Fatalf("failures %q", f.Failures)
	}
}

// A frozen-waiter fault's schedule: past the acceptance window but within the TTL, then past
// the TTL, in turn.
func TestPlanFrozenWaiter(t *testing.T) {
	ttl := 2 * time.Second
	win := acceptWindow(ttl)
	sch := newSchedule(runConf{Scenario: "sem-frozen-waiters", Seed: 7})
	for n := range 20 {
		p := sch.next(freezeWaiter, ttl)
		switch want := frozenVariants[n%len(frozenVariants)]; {
		case p.variant != want:
			t.Fatalf("fault %d: variant %q, want %q", n, p.variant, want)
		case want == "stop-past-window" && (p.dur <= win+waiterPauseMargin/2 || p.dur >= ttl-waiterPauseMargin/2):
			t.Fatalf("fault %d: pause %v, want past the window %v and short of the TTL %v", n, p.dur, win, ttl)
		case want == "stop-past-ttl" && p.dur <= ttl:
			t.Fatalf("fault %d: pause %v, want past the TTL %v", n, p.dur, ttl)
		}
	}
}

// frozenHistory is a semaphore of 3 (TTL 2 s, window 1 s) whose waiting process in slot 1
// (client "c1", both goroutines inside Acquire) is frozen from 100 to 1300 ms; the server
// granted its entry c1.3 a permit (token 20) at 105 ms, which lapsed at 1105 ms. Three other
// holds take the 3 permits until 1500 ms; worker 0's second goroutine got its last one after
// gap ms (from 14 ms). staleLive: the resumed goroutine returns from Acquire at 1301 ms with
// the lapsed grant's token and its context says "held" (else it says lost).
func frozenHistory(gap float64, announced, staleLive bool) *hist {
	h := newHist("sem-frozen-waiters", false)
	h.d.conf.TTL = 2 * time.Second
	w2 := who{2, 1, 0}
	w1, w1b := who{1, 1, 0}, who{1, 1, 1}
	h.sharedHold(w0, 1, 10, 1, 0, 1, []float64{2, 1400}, 1500)
	h.sharedHold(w2, 1, 11, 1, 0, 1.5, []float64{2, 1400}, 1500)
	h.sharedHold(w0b, 1, 12, 1, 10, 11, []float64{12}, 13)
	h.sharedHold(w0b, 2, 13, 1, 14, 14+gap, []float64{15 + gap, 1400}, 1500+gap)
	var live []float64
	if staleLive {
		live = []float64{1302}
	}
	h.sharedHold(w1, 1, 20, 1, 50, 1301, live, 1310)
	h.sharedHold(w1b, 1, 21, 1, 60, 1600+gap, []float64{1601 + gap}, 1602+gap)
	h.d.faults = []faultRec{{Kind: "sem-frozen-waiters", Variant: "stop-past-window", Slot: 0, Inc: 1, Token: 10, Start: msT(100), End: msT(1300),
		Waiter: &waiterHit{Slot: 1, Inc: 1, PID: 42, Entry: "c1.3", Queue: 7}}}
	if announced {
		h.d.announcements = []announcement{{T: msT(105), Payload: "G c1.3 20 1000 c0.8 13 1000"}, {T: msT(1550), Payload: "G c1.4 21 1000"}}
	}
	return h
}

func TestAnalyze_FrozenWaiters(t *testing.T) {
	// The resumed waiter's lease of the lapsed grant is dead on arrival: nothing is broken, and
	// the stall is the others' longest time without an acquisition (14 → 600 ms).
	f := analyze(frozenHistory(586, true, false).d, time.Second)
	if len(f.Failures) != 0 || f.WaiterGranted != 1 || f.StaleGrants != 1 || f.StaleGrantsLive != 0 ||
		len(f.Recovery) != 1 || f.Recovery[0] != time.Duration(msT(500)) {
		t.Fatalf("failures %q, granted %d, stale %d (%d live), stalls %v", f.Failures, f.WaiterGranted, f.StaleGrants, f.StaleGrantsLive, f.Recovery)
	}
	if !slices.ContainsFunc(f.Notes, func(n string) bool {
		return strings.Contains(n, "waiting at the freeze [2], holding [0]") && strings.Contains(n, "lapsed before it ran again [1]")
	}) {
		t.Fatalf("notes: %q", f.Notes)
	}
	// Its context says "held" beside the 3 permits' next holders: over-admission fails.
	f = analyze(frozenHistory(586, true, true).d, time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "more than 3 permits") || f.StaleGrantsLive != 1 || f.LiveAfterNext != 4 {
		t.Fatalf("failures %q, stale live %d, believed held over the size %d", f.Failures, f.StaleGrantsLive, f.LiveAfterNext)
	}
	// The others went over the window + TTL (3 s) without a permit: the queue stalled.
	f = analyze(frozenHistory(3100, true, false).d, time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "the queue stalled") {
		t.Fatalf("failures %q", f.Failures)
	}
	// No grant to the frozen process: the run proves nothing.
	f = analyze(frozenHistory(586, false, false).d, time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "proves nothing") {
		t.Fatalf("failures %q", f.Failures)
	}
}

// A Lua error inside a dlock script is noted in any scenario; a command the server refused
// inside a script (out of memory) is not such an error.
func TestAnalyze_ScriptErrorsNoted(t *testing.T) {
	h := newHist("kill", true)
	h.acq(w0, 10, 0, 1)
	h.ev(w1, event{K: "acq", S: msT(2), R: msT(3), Res: `err: dlock: lock "x" on 127.0.0.1:1: user_script:111: attempt to concatenate local 'meta' (a nil value) script: 3b73, on @user_script:111.`})
	h.ev(w1, event{K: "acq", S: msT(4), R: msT(5), Res: `err: dlock: lock "x": out of memory: OOM command not allowed when used memory > 'maxmemory'. script: 3b73, on @user_script:24.`})
	f := analyze(h.d, time.Second)
	if !slices.ContainsFunc(f.Notes, func(n string) bool {
		return strings.Contains(n, "1 Lock calls and 0 Unlocks failed with a Lua error") && strings.Contains(n, "user_script:111")
	}) {
		t.Fatalf("notes %q", f.Notes)
	}
}

func TestClockMap_PlacesTokensOnTheMonotonicTimeline(t *testing.T) {
	samples := []clockSample{sampleClocks()}
	before := mono()
	realUS := realtime() / 1000
	after := mono()
	samples = append(samples, sampleClocks())
	m := newClockMap(samples)
	got, ok := m.toMono(realUS * 1000)
	// The µs truncation can place it up to 1 µs early.
	if !ok || got < before-int64(time.Microsecond)-int64(50*time.Microsecond) || got > after+int64(50*time.Microsecond) {
		t.Fatalf("mapped to %d, want within [%d, %d]", got, before, after)
	}
	stepped := newClockMap([]clockSample{{mono: 0, real: 1e9}, {mono: 1e8, real: 5e9}})
	if _, ok := stepped.toMono(2e9); ok {
		t.Fatal("a stepped wall clock was not detected")
	}
}

// The latency fault: 50 ms ± 25 ms per direction, bytes in order.
func TestProxyJitter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	p, err := redistest.StartProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SetDelay(50 * time.Millisecond)
	p.SetJitter(25 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	lo, hi := time.Hour, time.Duration(0)
	for i := range 20 {
		start := time.Now()
		fmt.Fprintf(c, "%d\n", i)
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line != fmt.Sprintf("%d\n", i) {
			t.Fatalf("got %q, want %d", line, i)
		}
		rtt := time.Since(start)
		lo, hi = min(lo, rtt), max(hi, rtt)
	}
	// Two legs of 25–75 ms each.
	if lo < 50*time.Millisecond || hi > 400*time.Millisecond {
		t.Fatalf("round trips %v..%v, want within 50 ms..150 ms (plus scheduling)", lo, hi)
	}
	if hi-lo < 10*time.Millisecond {
		t.Fatalf("round trips %v..%v: no jitter", lo, hi)
	}
	_ = c.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	<-echoDone
}

// An election's terms: a leader that still acts (its context said "leading") after the next
// term began is two terms believed at once, a failure where the server keeps the leader's lease
// (partition); where the deployment can lose it (a restart without persistence) it is counted,
// as the hazard figure, and not failed. A check inside the next term's Campaign call cannot be
// judged.
func TestAnalyze_ElectionTermsBelievedAtOnce(t *testing.T) {
	h := newHist("elect-partition", true)
	h.acq(w0, 10, 0, 1)
	h.chk(w0, 10, 2, true)
	h.rmw(w0, 10, 1, 0, 3, 5, true)
	h.acq(w1, 11, 10, 600)
	h.chk(w0, 10, 599, true) // during 1's Campaign call: cannot tell
	h.chk(w0, 10, 650, true) // after it returned: two leaders
	h.sig(w0, 10, 660)
	h.chk(w1, 11, 601, true)
	h.rmw(w1, 11, 1, 1, 602, 604, true)
	h.d.faults = []faultRec{{Kind: "elect-partition", Slot: 0, Inc: 1, Token: 10, Start: msT(2)}}
	f := analyze(h.d, time.Second)
	if f.LeaderOverlaps != 1 || f.LeaderOverlapsUnsure != 0 || f.LeaderOverlapsHazard || len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "1 terms believed at once") {
		t.Fatalf("terms at once %d (+%d during, hazard %v), failures %q: want 1, one failure", f.LeaderOverlaps, f.LeaderOverlapsUnsure, f.LeaderOverlapsHazard, f.Failures)
	}
	if f.LiveAfterNext != 1 || f.UnsureLive != 1 || len(f.NewLeader) != 1 || f.NewLeader[0] != 598*time.Millisecond {
		t.Fatalf("live after next %d, unsure %d, new leader %v", f.LiveAfterNext, f.UnsureLive, f.NewLeader)
	}
	if c := leadersCell(f); c != "1" {
		t.Fatalf("cell %q", c)
	}
	// The last live check inside the next Campaign call only: unsure, no failure.
	h.d.events = slices.DeleteFunc(h.d.events, func(e event) bool { return e.K == "chk" && e.S == msT(650) })
	if f := analyze(h.d, time.Second); f.LeaderOverlaps != 0 || f.LeaderOverlapsUnsure != 1 || len(f.Failures) != 0 || leadersCell(f) != "0 (+1 during)" {
		t.Fatalf("unsure: terms at once %d (+%d during), failures %q, cell %q", f.LeaderOverlaps, f.LeaderOverlapsUnsure, f.Failures, leadersCell(f))
	}
	// A restart without persistence may lose the leader's lease: the hazard, counted not failed.
	h.chk(w0, 10, 650, true)
	h.d.conf.Scenario = "elect-restart"
	h.d.faults[0].Kind = "elect-restart"
	f = analyze(h.d, time.Second)
	if f.LeaderOverlaps != 1 || !f.LeaderOverlapsHazard || len(f.Failures) != 0 || leadersCell(f) != "1 (hazard)" {
		t.Fatalf("restart: terms at once %d (hazard %v), failures %q, cell %q: want 1 counted as the hazard, no failure", f.LeaderOverlaps, f.LeaderOverlapsHazard, f.Failures, leadersCell(f))
	}
	if !slices.ContainsFunc(f.Notes, func(n string) bool { return strings.Contains(n, "hazard") && strings.Contains(n, "term 10") }) {
		t.Fatalf("restart: no hazard note naming term 10: %q", f.Notes)
	}
	// The same restart on a server that persists: the lease was to survive, so it fails.
	h.d.conf.Scenario = "elect-restart-persist"
	h.d.faults[0].Kind, h.d.faults[0].Variant = "elect-restart-persist", restartKept+": the key holds token 10"
	if f := analyze(h.d, time.Second); f.LeaderOverlaps != 1 || f.LeaderOverlapsHazard || len(f.Failures) != 1 {
		t.Fatalf("restart-persist: terms at once %d (hazard %v), failures %q: want 1, failed", f.LeaderOverlaps, f.LeaderOverlapsHazard, f.Failures)
	}
}

// The other promises of an election: another process leads after each fault that deposes the
// leader; no term passes between campaigns of one process without the server; a restart of
// a persisting server that never brought the lease back proves nothing.
func TestAnalyze_ElectionSuccession(t *testing.T) {
	h := newHist("elect-kill", true)
	h.acq(w0, 10, 0, 1)
	h.rmw(w0, 10, 1, 0, 3, 5, true)
	h.acq(w0b, 5000, 6, 400) // the killed process's own candidate, queued before the kill
	h.d.faults = []faultRec{{Kind: "elect-kill", Slot: 0, Inc: 1, Token: 10, Start: msT(4)}}
	if f := analyze(h.d, time.Second); len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "no other process led") || len(f.NewLeader) != 0 {
		t.Fatalf("failures %q, new leader %v: want no other process led", f.Failures, f.NewLeader)
	}
	h.acq(who{0, 2, 0}, 9000, 300, 450) // the respawned process is another one
	if f := analyze(h.d, time.Second); len(f.Failures) != 0 || len(f.NewLeader) != 1 || f.NewLeader[0] != 446*time.Millisecond {
		t.Fatalf("failures %q, new leader %v: want none, 446ms", f.Failures, f.NewLeader)
	}

	h = newHist("elect-pause", true)
	h.acq(w0, 10, 0, 1)
	h.rmw(w0, 10, 1, 0, 3, 5, true)
	h.unl(w0, 10, 6, 7)
	h.acq(w0b, 11, 6.5, 8) // the next token, a sibling, inside the Resign: not through the server
	h.rmw(w0b, 11, 1, 1, 9, 10, true)
	if f := analyze(h.d, time.Second); f.LocalHandoffs != 1 || len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "without the server") {
		t.Fatalf("local handoffs %d, failures %q", f.LocalHandoffs, f.Failures)
	}

	h = newHist("elect-restart-persist", true)
	h.acq(w0, 10, 0, 1)
	h.rmw(w0, 10, 1, 0, 3, 5, true)
	h.acq(w1, 9000, 2, 400)
	h.d.faults = []faultRec{{Kind: "elect-restart-persist", Variant: restartGone + ": no key", Slot: 0, Inc: 1, Token: 10, Start: msT(4)}}
	if f := analyze(h.d, time.Second); len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "proves nothing") {
		t.Fatalf("failures %q: want the run to prove nothing", f.Failures)
	}
}

// End to end, an election under pauses: one SIGSTOP of the leader's process between its last
// check and its write, past its TTL, and one right after its read. Both kinds of candidates
// (Campaign and RunElected) lead; the frozen leader is told; another process leads after each
// pause; no two terms are believed at once; fenced, the late write is refused and nothing is
// lost, unfenced it lands and loses an update.
func TestRun_ElectionPause(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and five worker processes")
	}
	for _, fenced := range []bool{true, false} {
		t.Run(fmt.Sprint("fenced=", fenced), func(t *testing.T) {
			d, f := runForTest(t, runConf{
				Scenario: "elect-pause", Fenced: fenced, Seed: 1, Workers: 5, Goroutines: defaultGoroutines, TTL: 500 * time.Millisecond,
				Cycles: 30, MinFaults: 2, MaxRun: 30 * time.Second, Short: true,
			})
			if len(f.Failures) != 0 {
				t.Fatalf("failures: %q", f.Failures)
			}
			if f.Faults < 2 || d.faults[0].Variant != "before-write" || len(f.NewLeader) != f.Faults || f.Signals < 2 || f.LeaderOverlaps != 0 {
				t.Fatalf("faults %+v, new leader %v, signals %d, terms at once %d", d.faults, f.NewLeader, f.Signals, f.LeaderOverlaps)
			}
			led := map[int]int{} // terms by goroutine: g0 campaigns, g1 runs RunElected
			for _, e := range d.events {
				if e.K == "acq" && e.Res == "ok" {
					led[e.G]++
				}
			}
			if led[0] == 0 || led[1] == 0 || f.LocalHandoffs != 0 {
				t.Fatalf("terms by goroutine %v, local handoffs %d: want both kinds of candidates leading, through the server", led, f.LocalHandoffs)
			}
			if fenced && (f.StaleRejected < 1 || f.LostUpdates != 0 || f.Linearizable != porcupine.Ok) {
				t.Fatalf("fenced: stale refused %d, lost %d, %s", f.StaleRejected, f.LostUpdates, f.Linearizable)
			}
			if !fenced && (f.LostUpdates < 1 || f.Linearizable != porcupine.Illegal) {
				t.Fatalf("unfenced: lost %d, %s", f.LostUpdates, f.Linearizable)
			}
		})
	}
}

// End to end, in the smallest form that still shows what each mode is for: one SIGSTOP of a
// holder between its last context check and its write, past its TTL.
func TestRun_PauseBeforeWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and five worker processes")
	}
	for _, fenced := range []bool{true, false} {
		t.Run(fmt.Sprint("fenced=", fenced), func(t *testing.T) {
			d, f := runForTest(t, runConf{
				Scenario: "pause", Fenced: fenced, Seed: 1, Workers: 5, Goroutines: defaultGoroutines, TTL: 500 * time.Millisecond,
				Cycles: 30, MinFaults: 1, MaxRun: 30 * time.Second, Short: true,
			})
			if len(f.Failures) != 0 {
				t.Fatalf("failures: %q", f.Failures)
			}
			if f.Faults < 1 || d.faults[0].Variant != "before-write" || len(f.Recovery) < 1 || f.Signals < 1 {
				t.Fatalf("faults %+v, recovery %v, signals %d", d.faults, f.Recovery, f.Signals)
			}
			// The paused write lands after others made progress: refused with a fence, a lost
			// update without.
			if fenced && (f.StaleRejected < 1 || f.LostUpdates != 0 || f.Linearizable != porcupine.Ok) {
				t.Fatalf("fenced: stale refused %d, lost %d, %s", f.StaleRejected, f.LostUpdates, f.Linearizable)
			}
			if !fenced && (f.LostUpdates < 1 || f.Overlaps < 1 || f.Linearizable != porcupine.Illegal) {
				t.Fatalf("unfenced: lost %d, overlaps %d, %s", f.LostUpdates, f.Overlaps, f.Linearizable)
			}
		})
	}
}

// The same pause, on the register kept in SQLite through package fence and in Redis through the
// Client's fenced operations: fenced, the library's helpers refuse the paused holder's late
// operation (no update lost); unfenced, the plain reads and writes lose updates.
func TestRun_PauseOnStores(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and five worker processes")
	}
	for _, scen := range []string{"pause-sql", "pause-redis"} {
		for _, fenced := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fenced=%v", scen, fenced), func(t *testing.T) {
				d, f := runForTest(t, runConf{
					Scenario: scen, Fenced: fenced, Seed: 1, Workers: 5, Goroutines: defaultGoroutines, TTL: 500 * time.Millisecond,
					Cycles: 30, MinFaults: 1, MaxRun: 30 * time.Second, Short: true,
				})
				if len(f.Failures) != 0 {
					t.Fatalf("failures: %q", f.Failures)
				}
				if f.Faults < 1 || d.faults[0].Variant != "before-write" || f.Writes < 30 {
					t.Fatalf("faults %+v, %d writes", d.faults, f.Writes)
				}
				if fenced && (f.StaleRejected < 1 || f.StaleLanded != 0 || f.LostUpdates != 0 || f.Linearizable != porcupine.Ok) {
					t.Fatalf("fenced: stale refused %d landed %d, lost %d, %s", f.StaleRejected, f.StaleLanded, f.LostUpdates, f.Linearizable)
				}
				if !fenced && (f.StaleRejected != 0 || f.StaleLanded < 1 || f.LostUpdates < 1) {
					t.Fatalf("unfenced: stale refused %d landed %d, lost %d", f.StaleRejected, f.StaleLanded, f.LostUpdates)
				}
			})
		}
	}
}

// runForTest runs conf in a temporary directory (kept when the test fails) and analyzes it.
func runForTest(t *testing.T, conf runConf) (*runData, *findings) {
	t.Helper()
	root, err := os.MkdirTemp("", "dlock-check-test-")
	if err != nil {
		t.Fatal(err)
	}
	conf.Dir = filepath.Join(root, "run")
	conf.Logf = t.Logf
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker logs kept in %s", conf.Dir)
		} else {
			os.RemoveAll(root)
		}
	})
	d, err := run(conf)
	if err != nil {
		if errors.Is(err, redistest.ErrNotFound) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	f := analyze(d, 20*time.Second)
	t.Logf("\n%s", markdownTable([]*findings{f}))
	return d, f
}

// Goroutines of one worker process share its Client, so the lock passes between them without
// the server: the resource sees a goroutine's token followed by its sibling's token + 1. The run
// cuts a holder off from Redis while its siblings wait; every analysis keeps the goroutines
// apart, and the cut-off holder is told (the analysis fails the run otherwise).
func TestRun_LocalHandoffs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and five worker processes")
	}
	d, f := runForTest(t, runConf{
		Scenario: "partition", Fenced: true, Seed: 1, Workers: 5, Goroutines: 3, TTL: 500 * time.Millisecond,
		Cycles: 60, MinFaults: 1, MaxRun: 30 * time.Second, Short: true,
	})
	if len(f.Failures) != 0 {
		t.Fatalf("failures: %q", f.Failures)
	}
	// Count, on the resource's own record, the times the lock passed to a sibling goroutine
	// with the next token.
	passed := 0
	clients := map[who]bool{}
	var prev opRecord // the last accepted operation of an earlier lease
	for _, op := range d.ops {
		clients[op.who()] = true
		if !op.Accepted || op.Token == prev.Token {
			continue
		}
		if op.Token == prev.Token+1 && op.who().sameProcess(prev.who()) && op.G != prev.G {
			passed++
		}
		prev = op
	}
	if passed == 0 || f.LocalHandoffs < passed {
		t.Fatalf("the resource saw %d local handoffs, the analysis counted %d: want some, and at least as many", passed, f.LocalHandoffs)
	}
	if len(clients) <= 5 {
		t.Fatalf("%d goroutines reached the resource, want more than one per process", len(clients))
	}
	if f.Faults < 1 || f.Signals < 1 || f.LostUpdates != 0 || f.Linearizable != porcupine.Ok {
		t.Fatalf("faults %d, signals %d, lost %d, %s", f.Faults, f.Signals, f.LostUpdates, f.Linearizable)
	}
	t.Logf("%d local handoffs (%d seen by the resource) among %d acquisitions by %d goroutines", f.LocalHandoffs, passed, f.Cycles, len(clients))
}

// End to end, a frozen waiter of each shared kind: a process whose goroutines all wait is
// frozen past its acceptance window while the others keep releasing, so the server grants its
// entries units that lapse before it runs again; nothing may be believed held past the limits,
// and the others must go on.
func TestRun_FrozenWaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and five worker processes")
	}
	for _, c := range []struct {
		scenario string
		fenced   bool
	}{{"sem-frozen-waiters", false}, {"rw-frozen-waiters", true}} {
		t.Run(c.scenario, func(t *testing.T) {
			d, f := runForTest(t, runConf{
				Scenario: c.scenario, Fenced: c.fenced, Seed: 1, Workers: 5, Goroutines: frozenGoroutines, TTL: 2 * time.Second,
				Cycles: 30, MinFaults: len(frozenVariants), MaxRun: 30 * time.Second, Short: true,
			})
			if len(f.Failures) != 0 {
				t.Fatalf("failures: %q", f.Failures)
			}
			if f.Faults < len(frozenVariants) || len(f.Recovery) != f.Faults || f.WaiterGranted < 1 {
				t.Fatalf("faults %d, stalls %v, faults whose frozen waiter was granted units that lapsed %d", f.Faults, f.Recovery, f.WaiterGranted)
			}
			for _, flt := range d.faults {
				if flt.Waiter == nil || flt.Waiter.process().sameProcess(flt.who()) || flt.End-flt.Start <= int64(acceptWindow(2*time.Second)) {
					t.Fatalf("fault %+v: want a waiting process other than the holder's, frozen past the window", flt)
				}
			}
		})
	}
}

func TestWaitStopped(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	pid := cmd.Process.Pid
	if stopped, err := allStopped(pid); err != nil || stopped {
		t.Fatalf("running process reported stopped=%v (%v)", stopped, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := waitStopped(pid, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := waitStopped(pid, 20*time.Millisecond); err == nil {
		t.Fatal("a continued process still counts as stopped")
	}
}
