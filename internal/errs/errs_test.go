package errs

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A quorum failure says which servers answered what, matches ErrNoQuorum (not ErrNotAcquired:
// nobody was found holding the lock) and wraps the servers' errors.
func TestQuorumError(t *testing.T) {
	refused := errors.New("connection refused")
	e := &QuorumError{Op: "lock", Need: 3, Wait: 50 * time.Millisecond, Servers: []ServerState{
		{Addr: "a:1", State: "granted"},
		{Addr: "b:2", State: "held by another owner"},
		{Addr: "c:3", State: "error", Err: refused},
		{Addr: "d:4", State: "no answer"},
		{Addr: "e:5", State: "no answer"},
	}}
	msg := e.Error()
	for _, want := range []string{"2 of 5 servers answered the lock", "a majority needs 3", "a:1: granted", "c:3: error: connection refused", "d:4: no answer within 50ms"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	if !errors.Is(e, ErrNoQuorum) || errors.Is(e, ErrNotAcquired) {
		t.Error("want ErrNoQuorum and not ErrNotAcquired")
	}
	if !errors.Is(e, refused) {
		t.Error("does not wrap the servers' errors")
	}
}
