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

	"github.com/dlock-go/dlock/internal/redistest"
)

func queueLen(e *engine, key string) int {
	s := e.waits.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.m[key]; q != nil {
		return len(q.waiters)
	}
	return 0
}

// waitFor polls check with redistest.Poll until it returns nil, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := redistest.Poll(ctx, what, check); err != nil {
		t.Fatal(err)
	}
}

// haveQueued is a check for waitFor: n callers of e wait in key's queue.
func haveQueued(e *engine, key string, n int) func(context.Context) error {
	return func(context.Context) error {
		if got := queueLen(e, key); got != n {
			return fmt.Errorf("%d queued", got)
		}
		return nil
	}
}

// isLive is a check for waitFor: e's subscription to channel is live (the server confirmed it
// and no unsubscribe was decided since), or, with !live, it is not.
func isLive(e *engine, channel string, live bool) func(context.Context) error {
	return func(context.Context) error {
		e.notices.mu.Lock()
		got := e.notices.live[channel]
		e.notices.mu.Unlock()
		if got != live {
			return fmt.Errorf("live = %v", got)
		}
		return nil
	}
}

// privateServer starts a redis-server for one test and returns it, a context that ends with
// the test (30 s at most) and a dial function whose clients close when the test ends.
func privateServer(t *testing.T) (*redistest.Server, context.Context, func(...ClientOption) *Client) {
	t.Helper()
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	dial := func(opts ...ClientOption) *Client {
		t.Helper()
		c, err := Dial(ctx, s.URL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return s, ctx, dial
}

// Waiters of one client are served first-in first-out.
func TestLocalQueue_FIFO(t *testing.T) {
	_, ctx, dial := privateServer(t)
	c := dial()
	m := c.Mutex("fifo")
	holder, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			l.Unlock(ctx)
		}()
		waitFor(t, 10*time.Second, fmt.Sprintf("waiter %d to queue", i), haveQueued(c.e, m.spec.key, i+1)) // before starting i+1
	}
	holder.Unlock(ctx)
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("acquisition order %v, want 0..%d in order", order, n-1)
		}
	}
	if queueLen(c.e, m.spec.key) != 0 {
		t.Fatal("queue not removed after the last waiter left")
	}
	c.e.notices.mu.Lock()
	subs := len(c.e.notices.subs)
	c.e.notices.mu.Unlock()
	if subs != 0 {
		t.Fatalf("%d release channels still routed after every waiter left", subs)
	}
}

// serverValue returns the owner and token stored under the lock key.
func serverValue(t *testing.T, s *redistest.Server, key string) (owner string, token uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.Do(ctx, "GET", key)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(v)
	if len(f) < 2 {
		t.Fatalf("value %q: want owner and token", v)
	}
	n, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Fatalf("value %q: %v", v, err)
	}
	return f[0], n
}

// queueWaiters starts n goroutines that each Lock m (in FIFO order: each starts once the
// previous one is queued) and call hold with the lease before unlocking it. An Unlock error
// fails the test unless hold returned false.
func queueWaiters(t *testing.T, ctx context.Context, m *Mutex, n int, hold func(i int, l *Lease) bool) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			check := hold(i, l)
			if err := l.Unlock(ctx); err != nil && check {
				t.Error(err)
			}
		}()
		waitFor(t, 10*time.Second, fmt.Sprintf("waiter %d to queue", i), haveQueued(m.e, m.spec.key, i+1))
	}
	return &wg
}

// A lock passes among one client's waiters without the server localHandoffs times in a row:
// the server's value (owner, token) stays, each holder gets the next token; the next handoff
// goes through the server (new owner, a larger server token), and so on. The final release
// stores the last local token, and the next acquisition's token is larger still.
func TestLocalHandoff_TokensAndServerValue(t *testing.T) {
	s, ctx, dial := privateServer(t)
	c := dial()
	m := c.Mutex("chain")
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owner0, token0 := serverValue(t, s, m.spec.key)
	if token0 != first.Token() {
		t.Fatalf("server token %d, lease token %d", token0, first.Token())
	}
	const n = 2*localHandoffs + 4
	type hold struct {
		token  uint64
		owner  string // on the server while held
		stored uint64
	}
	holds := make([]hold, n)
	wg := queueWaiters(t, ctx, m, n, func(i int, l *Lease) bool {
		o, tok := serverValue(t, s, m.spec.key)
		holds[i] = hold{l.Token(), o, tok}
		return true
	})
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	base, owner := token0, owner0
	for i, h := range holds {
		k := uint64(i+1) % (localHandoffs + 1) // local handoffs since the last server token
		if k == 0 {
			// A handoff through the server: new owner secret, a token past the local ones.
			if h.owner == owner || h.token <= base+localHandoffs || h.stored != h.token {
				t.Fatalf("handoff %d: owner changed %v, token %d (previous server token %d), stored %d: want a server handoff",
					i+1, h.owner != owner, h.token, base, h.stored)
			}
			base, owner = h.token, h.owner
			continue
		}
		if h.owner != owner || h.stored != base || h.token != base+k {
			t.Fatalf("handoff %d: token %d, server value (same owner %v, token %d), want local: token %d over server token %d",
				i+1, h.token, h.owner == owner, h.stored, base+k, base)
		}
	}
	last := holds[n-1].token
	if o, tok := serverValue(t, s, m.spec.key); o != "-" || tok != last {
		t.Fatalf("after the last Unlock: owner %q token %d, want released with token %d", o, tok, last)
	}
	other := dial()
	l, err := other.Mutex("chain").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= last {
		t.Fatalf("next acquisition's token %d, not above the chain's last %d", l.Token(), last)
	}
	l.Unlock(ctx)
}

// A holder that got the lock by a local handoff has a lease like any other: renewed past its
// TTL, and told (ErrLost) when the lock is taken from it. The next holder's token is larger.
func TestLocalHandoff_RenewedAndLost(t *testing.T) {
	_, ctx, dial := privateServer(t)
	c := dial(WithTTL(300 * time.Millisecond))
	m := c.Mutex("renewed")
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease, 1)
	release := make(chan struct{})
	wg := queueWaiters(t, ctx, m, 1, func(_ int, l *Lease) bool {
		got <- l
		<-release
		return false // lost: its Unlock says so
	})
	first.Unlock(ctx)
	l := <-got
	if l.Token() != first.Token()+1 {
		t.Fatalf("token %d after %d: not a local handoff", l.Token(), first.Token())
	}
	// Several TTLs later the lease is still held and the server's value still has a lease.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err := l.Context().Err(); err != nil {
			t.Fatalf("lease ended while held: %v", context.Cause(l.Context()))
		}
	}
	if ttl, err := l.TTL(ctx); err != nil || ttl <= 0 {
		t.Fatalf("TTL = %v, %v", ttl, err)
	}
	admin := dial()
	if _, err := admin.ForceUnlock(ctx, "renewed"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
		if !errors.Is(context.Cause(l.Context()), ErrLost) {
			t.Fatalf("cause %v, want ErrLost", context.Cause(l.Context()))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the holder was not told that its lock was taken")
	}
	next, err := admin.Mutex("renewed").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= l.Token() {
		t.Fatalf("token %d after ForceUnlock, not above the local holder's %d", next.Token(), l.Token())
	}
	next.Unlock(ctx)
	close(release)
	wg.Wait()
}

// A waiter whose lease would differ (another TTL) gets the lock through the server.
func TestLocalHandoff_DifferentLeaseGoesThroughServer(t *testing.T) {
	s, ctx, dial := privateServer(t)
	c := dial()
	first, err := c.Mutex("ttl").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owner0, _ := serverValue(t, s, first.st.spec.key)
	m := c.Mutex("ttl", WithTTL(3*time.Second))
	var owner string
	var token uint64
	wg := queueWaiters(t, ctx, m, 1, func(_ int, l *Lease) bool {
		owner, _ = serverValue(t, s, m.spec.key)
		token = l.Token()
		return true
	})
	first.Unlock(ctx)
	wg.Wait()
	if owner == owner0 || token == first.Token()+1 {
		t.Fatalf("owner unchanged %v, token %d after %d: want a handoff through the server", owner == owner0, token, first.Token())
	}
}

// A lease received by local handoff can be re-entered: the server's value keeps the token of
// the client's hold (below the lease's), which re-entry must accept.
func TestLocalHandoff_Reentry(t *testing.T) {
	_, ctx, dial := privateServer(t)
	c := dial()
	m := c.Mutex("reentry")
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var inner error
	var innerToken uint64
	wg := queueWaiters(t, ctx, m, 1, func(_ int, l *Lease) bool {
		r, err := m.Lock(l.Context())
		if err != nil {
			inner = err
			return true
		}
		innerToken = r.Token()
		inner = r.Unlock(ctx)
		if err := l.Context().Err(); err != nil {
			inner = fmt.Errorf("lease ended after the re-entry: %v", context.Cause(l.Context()))
		}
		return true
	})
	first.Unlock(ctx)
	wg.Wait()
	if inner != nil {
		t.Fatalf("re-entering a locally handed-off lease: %v", inner)
	}
	if innerToken != first.Token()+1 {
		t.Fatalf("re-entry token %d, want the lease's %d", innerToken, first.Token()+1)
	}
}

// A client whose grant was announced while it was not subscribed (the announcement is lost)
// claims the lock at its next attempt under the same registration: same owner, the granted
// token, the full lease; and a later announcement of the same grant makes no second lease.
func TestGrant_MissedAnnouncementIsClaimed(t *testing.T) {
	_, ctx, dial := privateServer(t)
	holder, waiter := dial(), dial()
	name := "claimed"
	l, err := holder.Mutex(name, WithTTL(30*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := waiter.Mutex(name, WithTTL(5*time.Second))
	e, spec := waiter.e, m.spec
	reg := e.newRegistration(spec)
	st, h, err := e.attempt(ctx, spec, reg) // queues on the server; not subscribed to anything
	if err != nil || st != nil {
		t.Fatalf("attempt on a held lock: %v, %v", st, err)
	}
	if h.token != l.Token() {
		t.Fatalf("refused by token %d, want the holder's %d", h.token, l.Token())
	}
	if err := l.Unlock(ctx); err != nil { // grants it to reg, announced to nobody
		t.Fatal(err)
	}
	st, _, err = e.attempt(ctx, spec, reg)
	if err != nil || st == nil {
		t.Fatalf("attempt after the grant: %v, %v; want the granted lease", st, err)
	}
	if st.owner != reg.owner || st.token <= l.Token() {
		t.Fatalf("claimed lease owner %q token %d; want the registration's owner and a token above %d", st.owner, st.token, l.Token())
	}
	lease := &Lease{st: st}
	if ttl, err := lease.TTL(ctx); err != nil || ttl <= time.Second {
		t.Fatalf("claimed lease TTL %v, %v: want the full 5 s lease, not the 1 s window", ttl, err)
	}
	e.granted(reg.id, st.token, 0, time.Second) // the announcement after all: ignored
	if e.renewer.h.Len() != 1 {
		t.Fatalf("%d leases in the renewal loop, want 1", e.renewer.h.Len())
	}
	if err := lease.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A grant announced before the reply to the attempt that registered (they travel on
// different connections) is kept until that reply comes, then taken.
func TestGrant_EarlyAnnouncement(t *testing.T) {
	_, _, dial := privateServer(t)
	c := dial()
	m := c.Mutex("early")
	e := c.e
	reg := e.newRegistration(m.spec)
	e.granted(reg.id, 12345, 0, time.Second) // not registered yet: kept
	if _, ok := e.waits.early[reg.id]; !ok {
		t.Fatal("early grant not kept")
	}
	e.registered(reg, mono(), 1, nil)
	if reg.state.Load() != regDone {
		t.Fatalf("registration state %d after its early grant, want done", reg.state.Load())
	}
	if reg.pending == nil || reg.pending.token != 12345 {
		t.Fatalf("pending lease %+v, want the granted one", reg.pending)
	}
	reg.pending.end(endReleased, nil)
}

// A grant announced with a token not above that of a holder an attempt under the same
// registration saw is stale: the grant lapsed while the client was paused (its announcement
// still buffered), someone else took the lock, and the attempt that found them queued the entry
// again under the same id. The client must not make a lease of it; a later grant counts.
func TestGrant_StaleAnnouncementAfterRequeue(t *testing.T) {
	_, _, dial := privateServer(t)
	c := dial()
	m := c.Mutex("stale-grant")
	e := c.e
	reg := e.newRegistration(m.spec)
	e.registered(reg, mono(), 1, []uint64{5000}) // the attempt after the pause saw holder 5000
	e.granted(reg.id, 4000, 0, time.Second)      // the lapsed grant's buffered announcement
	if reg.state.Load() != regQueued || reg.pending != nil {
		t.Fatalf("stale grant taken: state %d, pending %+v", reg.state.Load(), reg.pending)
	}
	e.granted(reg.id, 6000, 0, time.Second) // a grant made after that attempt
	if reg.state.Load() != regDone || reg.pending == nil || reg.pending.token != 6000 {
		t.Fatalf("later grant not taken: state %d, pending %+v", reg.state.Load(), reg.pending)
	}
	reg.pending.end(endReleased, nil)
}

// In quorum mode each server announces its own grant, and any of them may come before the
// reply to the attempt that registered: they are kept per server, and once the registration is
// known they count (a majority of them makes the lease without a claim).
func TestGrant_EarlyAnnouncementsQuorum(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var urls []string
	for range 3 {
		urls = append(urls, redistest.Start(t).URL())
	}
	c, err := DialQuorum(ctx, urls)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := c.e
	reg := e.newRegistration(c.Mutex("early-quorum").spec)
	e.granted(reg.id, 700, 0, time.Second) // before the attempt's reply: kept
	e.granted(reg.id, 800, 2, time.Second)
	if g, ok := e.waits.early[reg.id]; !ok || g.tokens[0] != 700 || g.tokens[2] != 800 {
		t.Fatalf("early grants %+v, want servers 0 and 2 kept", e.waits.early[reg.id])
	}
	sent := mono()
	e.registered(reg, sent, 0b011, []uint64{100, 100, 0}) // servers 0 and 1 answered in time
	e.registeredLate(reg, sent, 2, 100)                   // server 2 after the decision
	if reg.state.Load() != regQueued {
		t.Fatalf("registration state %d with one counted grant, want queued", reg.state.Load())
	}
	e.granted(reg.id, 900, 2, time.Second) // server 2 again: the majority (0 and 2) is now known
	if reg.state.Load() != regDone || reg.pending == nil || reg.pending.token != 900 {
		t.Fatalf("state %d, pending %+v: want the lease of a majority's grants, token 900", reg.state.Load(), reg.pending)
	}
	reg.pending.end(endReleased, nil)
}
