package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
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

func TestSetUser(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := ctxTimeout(t, 10*time.Second)
	if err := s.SetUser(ctx, "app", "secret", "~app:*", "+get", "+set"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.DoAs(ctx, "app", "secret", "SET", "app:1", "x"); err != nil || got != "OK" {
		t.Errorf("SET app:1 as app = %q, %v", got, err)
	}
	var re *Error
	if _, err := s.DoAs(ctx, "app", "secret", "SET", "other", "x"); !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "NOPERM") {
		t.Errorf("SET other as app: %v, want NOPERM", err)
	}
	if _, err := s.DoAs(ctx, "app", "secret", "DEL", "app:1"); !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "NOPERM") {
		t.Errorf("DEL as app: %v, want NOPERM", err)
	}
	if _, err := s.DoAs(ctx, "app", "wrong", "PING"); err == nil {
		t.Error("AUTH with a wrong password succeeded")
	}
	s.SetURLUser("app", "p@ss")
	if want := "redis://app:p%40ss@127.0.0.1:" + strconv.Itoa(s.Port) + "/0"; s.URL() != want {
		t.Errorf("URL = %q, want %q", s.URL(), want)
	}
	// Do stays the default user.
	if got := mustDo(t, s, "DEL", "app:1"); got != "1" {
		t.Errorf("DEL as default = %q", got)
	}
}
