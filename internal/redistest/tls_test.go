package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"
)

func TestTLS(t *testing.T) {
	t.Parallel()
	s := Start(t, WithTLS())
	if want := "rediss://127.0.0.1:" + strconv.Itoa(s.Port) + "/0"; s.URL() != want {
		t.Errorf("URL = %q, want %q", s.URL(), want)
	}
	if got := mustDo(t, s, "SET", "k", "v"); got != "OK" {
		t.Errorf("SET over TLS = %q", got)
	}
	if got := mustDo(t, s, "CONFIG", "GET", "port"); got != "port\n0" {
		t.Errorf("plain port = %q, want 0 (TLS only)", got)
	}
	// The CA file verifies the server's certificate for 127.0.0.1.
	pem, err := os.ReadFile(s.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("CAFile holds no certificate")
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", s.Addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("TLS handshake with the CA file: %v", err)
	}
	c.Close()
	// Another CA does not.
	other, err := NewCAFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pem, _ = os.ReadFile(other)
	pool = x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	_, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", s.Addr, &tls.Config{RootCAs: pool})
	var uerr x509.UnknownAuthorityError
	if !errors.As(err, &uerr) {
		t.Errorf("handshake with another CA: %v, want an unknown authority error", err)
	}
	// A plain-text client gets nowhere.
	if _, err := Do(ctxTimeout(t, 2*time.Second), s.Addr, "PING"); err == nil {
		t.Error("plain PING to a TLS-only server succeeded")
	}
	// Restart keeps the certificates.
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := mustDo(t, s, "PING"); got != "PONG" {
		t.Errorf("PING after restart = %q", got)
	}
}
