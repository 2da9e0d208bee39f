package dlock

import (
	"testing"
	"time"
)

// A turn (WithTurnSlice) begins when the lock reaches the client, not when the request that got
// it was sent: a grant's lease is valid from the last refresh of its queue entry, which may be
// a window before the grant, and a turn dated from there would be over before it began.
func TestTurn_BeginsWhenTheLockArrives(t *testing.T) {
	_, _, dial := privateServer(t)
	c := dial(WithTurnSlice(100 * time.Millisecond))
	m := c.Mutex("turn-start", WithTurnSlice(100*time.Millisecond))
	reg := c.e.newRegistration(m.spec)
	from := mono() - int64(800*time.Millisecond) // the entry's last refresh, long before the grant
	before := mono()
	st := c.e.grantLease(reg, from)
	if st.turn < before {
		t.Errorf("the turn of a grant began %v before the grant", time.Duration(before-st.turn))
	}
	if st.lastSent != from {
		t.Errorf("the lease is valid from %d, want the entry's refresh %d", st.lastSent, from)
	}
	if m2 := c.Mutex("no-turn", WithTurnSlice(0)); newLeaseState(c.e, m2.spec, t.Context(), "o", 1, from).turn != 0 {
		t.Error("a lease without a turn slice keeps a turn")
	}
}
