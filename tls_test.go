package dlock_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisconn"
)

// TLS with a CA made at test time: the server is TLS only, and its certificate is signed by a
// CA no system trusts.
func TestTLS_LockUnlock(t *testing.T) {
	s := redistest.Start(t, redistest.WithTLS())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cn, err := rueidisconn.Dial(ctx, s.URL(), rueidisconn.WithTLSConfig(s.TLSConfig()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dlock.New(cn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c.Close()
		cn.Close()
	}()
	l, err := c.Mutex(uniqueName(t)).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock over TLS: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock over TLS: %v", err)
	}

	// Without the CA (the system's roots), or trusting another CA, the handshake fails, and
	// the error names the address and the certificate problem.
	other, err := redistest.NewCAFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	_, err = rueidisconn.Dial(ctx, s.URL(), rueidisconn.WithTLSConfig(&tls.Config{RootCAs: pool}))
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") || !strings.Contains(err.Error(), s.Addr) {
		t.Errorf("Dial trusting another CA = %v, want an unknown-authority error naming %s", err, s.Addr)
	} else {
		t.Logf("another CA: %v", err)
	}
	_, err = dlock.Dial(ctx, s.URL())
	if err == nil || !strings.Contains(err.Error(), "certificate") || !strings.Contains(err.Error(), s.Addr) {
		t.Errorf("Dial without the CA = %v, want a certificate error naming %s", err, s.Addr)
	}
}
