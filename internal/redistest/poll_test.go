package redistest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Poll returns as soon as check is satisfied; once ctx ends, it returns ctx's error with what
// it waited for and check's last complaint.
func TestPoll(t *testing.T) {
	calls := 0
	err := Poll(ctxTimeout(t, 5*time.Second), "the third call", func(context.Context) error {
		calls++
		if calls < 3 {
			return fmt.Errorf("call %d", calls)
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Poll = %v after %d calls, want nil after 3", err, calls)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	calls = 0
	err = Poll(ctx, "a condition that never holds", func(context.Context) error {
		calls++
		return fmt.Errorf("complaint %d", calls)
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "a condition that never holds") ||
		!strings.Contains(err.Error(), fmt.Sprintf("complaint %d", calls)) {
		t.Fatalf("Poll past its deadline = %v, want DeadlineExceeded naming what it waited for and the last complaint (%d)", err, calls)
	}
}
