package dlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TLS with a CA made at test time: the server is TLS only, and its certificate (for 127.0.0.1)
// is signed by a CA no system trusts.
func TestTLS_LockUnlockWithCAFile(t *testing.T) {
	s := redistest.Start(t, redistest.WithTLS())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, s.URL(), dlock.WithCAFile(s.CAFile()))
	if err != nil {
		t.Fatalf("Dial(%s, WithCAFile): %v", s.URL(), err)
	}
	defer c.Close()
	name := uniqueName(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock over TLS: %v", err)
	}
	if v := redisDo(t, s, "GET", keyOf(name)); !strings.Contains(v, " ") || strings.HasPrefix(v, "- ") {
		t.Errorf("value while locked = %q", v)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock over TLS: %v", err)
	}

	// Trusting another CA, or the system's roots, the handshake fails, and the error names the
	// address and the certificate problem.
	other, err := redistest.NewCAFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = dlock.Dial(ctx, s.URL(), dlock.WithCAFile(other))
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") || !strings.Contains(err.Error(), s.Addr) {
		t.Errorf("Dial with another CA = %v, want an unknown-authority error naming %s", err, s.Addr)
	} else {
		t.Logf("another CA: %v", err)
	}
	_, err = dlock.Dial(ctx, s.URL())
	if err == nil || !strings.Contains(err.Error(), "certificate") || !strings.Contains(err.Error(), s.Addr) {
		t.Errorf("Dial without the CA = %v, want a certificate error naming %s", err, s.Addr)
	}
}
