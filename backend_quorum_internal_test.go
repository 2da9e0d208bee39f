package dlock

import (
	"errors"
	"testing"
)

// A quorum failure without any server error (too few answered within the lease) still prints.
func TestNoQuorumError(t *testing.T) {
	e := &noQuorumError{msg: "dlock: no quorum: 2 of 5 servers answered in time, a majority needs 3"}
	if e.Error() != e.msg {
		t.Fatalf("Error() = %q", e.Error())
	}
	if !errors.Is(e, ErrNotAcquired) {
		t.Fatal("does not match ErrNotAcquired")
	}
	e.errs = errors.New("127.0.0.1:1: connection refused")
	if e.Error() != e.msg+": 127.0.0.1:1: connection refused" {
		t.Fatalf("Error() = %q", e.Error())
	}
}
