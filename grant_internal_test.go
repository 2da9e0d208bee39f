package dlock

import (
	"testing"
	"time"
)

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
	e.granted(reg.id, st.token) // the announcement after all: ignored
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
	e.granted(reg.id, 12345) // not registered yet: kept
	if _, ok := e.waits.early[reg.id]; !ok {
		t.Fatal("early grant not kept")
	}
	e.registered(reg, mono())
	if reg.state.Load() != regDone {
		t.Fatalf("registration state %d after its early grant, want done", reg.state.Load())
	}
	if reg.pending == nil || reg.pending.token != 12345 {
		t.Fatalf("pending lease %+v, want the granted one", reg.pending)
	}
	reg.pending.end(endReleased, nil)
}
