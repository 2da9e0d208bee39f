package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/internal/protocol"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Batching (internal/backend/batch.go), on a private server: a paused server holds the first calls on the
// wire, so that the calls made meanwhile wait for one batch, which the server then runs as
// one acquire.lua (or release.lua) call.

// batchClients dials s through each transport.
func batchClients(t *testing.T, s *redistest.Server) map[string]*Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := Dial(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	o, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	o.ContextTimeoutEnabled = true
	rc := redis.NewClient(o)
	g, err := New(goredisconn.New(rc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Close()
		rc.Close()
	})
	return map[string]*Client{"rueidis": r, "goredis": g}
}

// commandCalls returns the calls of each command the server ran since its last CONFIG
// RESETSTAT, commands run by scripts included (INFO commandstats).
func commandCalls(t *testing.T, s *redistest.Server) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, line := range strings.Split(doT(t, s, "INFO", "commandstats"), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.Atoi(calls)
	}
	return out
}

func doT(t *testing.T, s *redistest.Server, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := s.Do(ctx, args...)
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	return out
}

// inBatch runs the first calls of calls (blockers: each leaves alone) while s is paused, then
// the rest, which wait for the next batch; it resumes s once they all wait, and returns when
// every call has. It fails t unless the rest waited, together, for one batch.
func inBatch(t *testing.T, s *redistest.Server, c *Client, blockers []func(), calls []func(), acquisitions bool) {
	t.Helper()
	inBatchWith(t, s, c, blockers, calls, nil, acquisitions)
}

// inBatchWith is inBatch with more calls, bg, that join the batch but are not waited for.
func inBatchWith(t *testing.T, s *redistest.Server, c *Client, blockers, calls, bg []func(), acquisitions bool) {
	t.Helper()
	b := c.e.b.(*backend.OneServer).Batch
	if b == nil {
		t.Fatal("no batcher on one server")
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	// One call alone and one batch may be on their way (the limits lowered to make the slots
	// few), taken by the blockers one after the other.
	b.SetLimits(1, 1)
	for i, f := range blockers {
		run(f)
		poll(t, 10*time.Second, "the blockers on their way", func() error {
			out, acqs, rels := b.Load()
			if out < i+1 || acqs+rels > 0 {
				return fmt.Errorf("%d calls on their way, %d waiting", out, acqs+rels)
			}
			return nil
		})
	}
	for _, f := range calls {
		run(f)
	}
	for _, f := range bg {
		go f()
	}
	poll(t, 10*time.Second, "the calls waiting for a batch", func() error {
		_, acqs, n := b.Load()
		if acquisitions {
			n = acqs
		}
		if n != len(calls)+len(bg) {
			return fmt.Errorf("%d of %d waiting", n, len(calls)+len(bg))
		}
		return nil
	})
	resumed = true
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func poll(t *testing.T, within time.Duration, what string, check func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := redistest.Poll(ctx, what, func(context.Context) error { return check() }); err != nil {
		t.Fatal(err)
	}
}

// loadScripts loads every script, so that no call needs the EVAL fallback and each script call
// counts once as an EVALSHA.
func loadScripts(t *testing.T, s *redistest.Server) {
	t.Helper()
	for _, sc := range Scripts() {
		doT(t, s, "SCRIPT", "LOAD", sc.Src)
	}
}

// Concurrent acquisitions of distinct names go as one acquire.lua call (one EVALSHA, one TIME
// and one EXISTS for them all), and so do their releases; each lock gets its own lease and
// token.
func TestBatch_ConcurrentCallsInOneScriptCall(t *testing.T) {
	const blockersN = 2 // one call alone and one batch (inBatchWith)
	s := redistest.Start(t)
	loadScripts(t, s)
	for tr, c := range batchClients(t, s) {
		t.Run(tr, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const n = 30
			leases := make([]*Lease, n+blockersN)
			errs := make([]error, n+blockersN)
			lock := func(i int) func() {
				return func() { leases[i], errs[i] = c.Mutex(fmt.Sprintf("%s-%d", t.Name(), i)).Lock(ctx) }
			}
			var blockers, calls []func()
			for i := range blockersN {
				blockers = append(blockers, lock(i))
			}
			for i := blockersN; i < n+blockersN; i++ {
				calls = append(calls, lock(i))
			}
			doT(t, s, "CONFIG", "RESETSTAT")
			inBatch(t, s, c, blockers, calls, true)
			got := commandCalls(t, s)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("Lock %d: %v", i, err)
				}
			}
			if got["evalsha"] != blockersN+1 || got["time"] != blockersN+1 || got["exists"] != blockersN+1 || got["set"] != n+blockersN {
				t.Fatalf("%d acquisitions: %d EVALSHA, %d TIME, %d EXISTS, %d SET; want %d, %d, %d, %d (the blockers alone, the rest in one call)",
					n+blockersN, got["evalsha"], got["time"], got["exists"], got["set"], blockersN+1, blockersN+1, blockersN+1, n+blockersN)
			}
			owners := map[string]bool{}
			for i, l := range leases {
				owner, token := serverValue(t, s, l.st.spec.key)
				if owner != l.st.owner || token != l.Token() || token == 0 || owners[owner] {
					t.Fatalf("lock %d: server has %s %d, lease %s %d (owners must differ)", i, owner, token, l.st.owner, l.Token())
				}
				owners[owner] = true
			}

			doT(t, s, "CONFIG", "RESETSTAT")
			uerrs := make([]error, len(leases))
			unlock := func(i int) func() { return func() { uerrs[i] = leases[i].Unlock(ctx) } }
			blockers, calls = nil, nil
			for i := range leases {
				if i < blockersN {
					blockers = append(blockers, unlock(i))
				} else {
					calls = append(calls, unlock(i))
				}
			}
			inBatch(t, s, c, blockers, calls, false)
			got = commandCalls(t, s)
			for i, err := range uerrs {
				if err != nil {
					t.Fatalf("Unlock %d: %v", i, err)
				}
			}
			if got["evalsha"] != blockersN+1 || got["exists"] != blockersN+1 || got["pubsub|numsub"] != blockersN+1 || got["pubsub|numpat"] != blockersN+1 {
				t.Fatalf("%d releases: %d EVALSHA, %d EXISTS, %d NUMSUB, %d NUMPAT; want %d of each", len(leases),
					got["evalsha"], got["exists"], got["pubsub|numsub"], got["pubsub|numpat"], blockersN+1)
			}
			for i, l := range leases {
				v := doT(t, s, "GET", l.st.spec.key)
				if want := "- " + strconv.FormatUint(l.Token(), 10) + " 0"; v != want {
					t.Fatalf("lock %d after Unlock: %q, want %q", i, v, want)
				}
			}
		})
	}
}

// Every lock of a batch gets the answer a call of its own would have: taken, busy (with the
// holder's token), queued, re-entered, the same name twice (one of the two), a key of another
// type (its error, the others unharmed); and in a batch of releases: released, one hold of a
// re-entered lease, lost, withdrawn with its queue entry.
func TestBatch_EachLockItsOwnAnswer(t *testing.T) {
	s := redistest.Start(t)
	for tr, c := range batchClients(t, s) {
		t.Run(tr, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			other := batchClients(t, s)[tr]
			name := func(what string) string { return t.Name() + "-" + what }
			busy, err := other.Mutex(name("busy")).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			waited, err := other.Mutex(name("waited")).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			outer, err := c.Mutex(name("reenter")).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			doT(t, s, "HSET", protocol.LockKey(DefaultPrefix, name("hash")), "f", "v")

			var (
				free, inner, twiceA, twiceB, queued                        *Lease
				errBusy, errFree, errInner, errA, errB, errHash, errQueued error
			)
			queuedDone := make(chan struct{})
			blockers := []func(){
				func() { c.Mutex(name("blocker1")).TryLock(ctx) },
				func() { c.Mutex(name("blocker2")).TryLock(ctx) },
			}
			calls := []func(){
				func() { free, errFree = c.Mutex(name("free")).TryLock(ctx) },
				func() { _, errBusy = c.Mutex(name("busy")).TryLock(ctx) },
				func() { inner, errInner = c.Mutex(name("reenter")).Lock(outer.Context()) },
				func() { twiceA, errA = c.Mutex(name("twice")).TryLock(ctx) },
				func() { twiceB, errB = c.Mutex(name("twice")).TryLock(ctx) },
				func() { _, errHash = c.Mutex(name("hash")).TryLock(ctx) },
			}
			// A waiting Lock's first attempt goes in the batch too.
			inBatchWith(t, s, c, blockers, calls, []func(){func() {
				defer close(queuedDone)
				queued, errQueued = c.Mutex(name("waited")).Lock(ctx)
			}}, true)

			if errFree != nil || free == nil || lockValueOf(t, s, name("free"))[0] != free.st.owner {
				t.Fatalf("free name: %v", errFree)
			}
			var na *NotAcquiredError
			if !errors.As(errBusy, &na) || na.Holder.Token != busy.Token() {
				t.Fatalf("busy name: %v, want NotAcquiredError naming token %d", errBusy, busy.Token())
			}
			if errInner != nil || inner.Token() != outer.Token() || lockValueOf(t, s, name("reenter"))[2] != "2" {
				t.Fatalf("re-entry: %v (value %q)", errInner, lockValueOf(t, s, name("reenter")))
			}
			if (errA == nil) == (errB == nil) || !errors.Is(errors.Join(errA, errB), ErrNotAcquired) {
				t.Fatalf("one name twice: %v, %v; want one taken, one busy", errA, errB)
			}
			if errHash == nil || !strings.Contains(errHash.Error(), "WRONGTYPE") {
				t.Fatalf("a key of another type: %v, want WRONGTYPE", errHash)
			}
			if doT(t, s, "ZCARD", protocol.LockKey(DefaultPrefix, name("waited"))+":q") != "1" {
				t.Fatalf("the waiting Lock is not queued on the server")
			}

			// Releases in one batch: released, one hold of two, lost, and the held "twice".
			held := twiceA
			if held == nil {
				held = twiceB
			}
			lost, err := c.Mutex(name("lost")).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			doT(t, s, "SET", protocol.LockKey(DefaultPrefix, name("lost")), "someone-else 1 1 {}", "PX", "60000")
			var errRelFree, errRelInner, errRelLost, errRelHeld error
			b1, err := c.Mutex(name("blocker3")).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b2, err := c.Mutex(name("blocker4")).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			inBatch(t, s, c, []func(){func() { b1.Unlock(ctx) }, func() { b2.Unlock(ctx) }}, []func(){
				func() { errRelFree = free.Unlock(ctx) },
				func() { errRelInner = inner.Unlock(ctx) },
				func() { errRelLost = lost.Unlock(ctx) },
				func() { errRelHeld = held.Unlock(ctx) },
			}, false)
			if errRelFree != nil || lockValueOf(t, s, name("free"))[0] != "-" {
				t.Fatalf("release: %v, value %q", errRelFree, lockValueOf(t, s, name("free")))
			}
			if errRelInner != nil || lockValueOf(t, s, name("reenter"))[2] != "1" || outer.Context().Err() != nil {
				t.Fatalf("inner hold: %v, value %q", errRelInner, lockValueOf(t, s, name("reenter")))
			}
			if !errors.Is(errRelLost, ErrLost) || lockValueOf(t, s, name("lost"))[0] != "someone-else" {
				t.Fatalf("lost lease: %v, want ErrLost and the other owner's value kept", errRelLost)
			}
			if errRelHeld != nil {
				t.Fatalf("release of the name taken twice: %v", errRelHeld)
			}
			// The waiting Lock is granted the lock when its holder lets go.
			if err := waited.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			<-queuedDone
			if errQueued != nil || lockValueOf(t, s, name("waited"))[0] != queued.st.owner {
				t.Fatalf("queued Lock: %v", errQueued)
			}
			queued.Unlock(ctx)
			outer.Unlock(ctx)
			busy.Unlock(ctx)
		})
	}
}

// lockValueOf splits the value of the lock called name: owner, token, holds, description.
func lockValueOf(t *testing.T, s *redistest.Server, name string) []string {
	t.Helper()
	return strings.SplitN(doT(t, s, "GET", protocol.LockKey(DefaultPrefix, name)), " ", 4)
}

// acquire.lua with mode "r" never takes a free lock, also when the key is gone altogether (a
// lease whose key expired must not get a new lock under its old owner).
func TestAcquireScript_ReenterOnlyNeverTakesAFreeLock(t *testing.T) {
	s := redistest.Start(t)
	key := protocol.LockKey(DefaultPrefix, t.Name())
	a := protocol.AcquireArgs{Keys: []string{key, key + ":q", key + ":w"}, Owner: "owner:1", TTL: "10000", Meta: "{}", ReenterOnly: true}
	c := a.Call()
	args := append([]string{"EVAL", protocol.ScriptAcquire.Src, "3"}, c.Keys...)
	out := doT(t, s, append(args, c.Args...)...)
	if !strings.Contains(out, "-2") {
		t.Fatalf("re-entry of a missing key: %q, want {0, -2, 0}", out)
	}
	if v := doT(t, s, "EXISTS", key); v != "0" {
		t.Fatalf("re-entry of a missing key made it (EXISTS = %s)", v)
	}
}
