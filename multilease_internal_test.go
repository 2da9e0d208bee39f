package dlock

import (
	"context"
	"errors"
	"testing"
)

// The last Unlock of a lease, single or multi, marks each lock it releases as releasing before
// the release is sent: a renewal already on its way that reaches the server after the release
// (the go-redis transport sends on several connections) is then refused for this Unlock's
// doing, and the renewal loop leaves the ending to the Unlock instead of reporting a loss.
func TestUnlock_MarksReleasingBeforeTheRelease(t *testing.T) {
	_, ctx, dial := privateServer(t)
	c := dial()
	single, err := c.Mutex("releasing-one").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	multi, err := c.MultiMutex([]string{"releasing-a", "releasing-b"}).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	states := []*leaseState{single.st}
	for _, m := range multi.multi.members {
		states = append(states, m.st)
	}
	for _, l := range []*Lease{single, multi} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range states {
		if !st.releasing.Load() {
			t.Errorf("lock %q: released without being marked releasing", st.spec.name)
		}
		if cause := context.Cause(leaseOf(st).Context()); errors.Is(cause, ErrLost) {
			t.Errorf("lock %q: ended as lost (%v) by its own Unlock", st.spec.name, cause)
		}
	}
}
