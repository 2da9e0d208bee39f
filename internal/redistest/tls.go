package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// tlsDirName is the subdirectory of Server.Dir holding a TLS server's
// certificates; Restart keeps it.
const tlsDirName = "tls"

// WithTLS starts a TLS-only server: no plain TCP port (--port 0), TLS on
// Server.Port, with a CA and a server certificate for 127.0.0.1 generated
// for it. Clients need not present a certificate (--tls-auth-clients no).
// URL then starts with "rediss://", Do speaks TLS, CAFile names the CA
// certificate and TLSConfig returns a client configuration trusting it.
func WithTLS() Option {
	return func(c *config) { c.tls = true }
}

// tlsFiles is what a TLS server was started with.
type tlsFiles struct {
	caFile, certFile, keyFile string
	client                    *tls.Config // trusts caFile, for Do
}

// CAFile returns the path of the PEM file with the CA certificate that
// signed a TLS server's certificate (WithTLS), or "" for a plain server.
func (s *Server) CAFile() string {
	if s.tls == nil {
		return ""
	}
	return s.tls.caFile
}

// TLSConfig returns a new client TLS configuration that trusts the server's
// CA (WithTLS), or nil for a plain server.
func (s *Server) TLSConfig() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.client.Clone()
}

// prepare writes what the server needs in Dir before its first start.
func (s *Server) prepare(cfg *config) error {
	if cfg.sentinelConf != "" {
		s.sentinel = true
		if err := os.WriteFile(filepath.Join(s.Dir, sentinelConfName), []byte(cfg.sentinelConf), 0o644); err != nil {
			return err
		}
	}
	if cfg.tls {
		files, err := writeServerTLS(filepath.Join(s.Dir, tlsDirName))
		if err != nil {
			return fmt.Errorf("tls certificates: %w", err)
		}
		s.tls = files
	}
	return nil
}

// NewCAFile writes the certificate of a fresh CA, unrelated to any server's,
// as PEM to a new file in dir and returns its path: a wrong CA for tests.
func NewCAFile(dir string) (string, error) {
	ca, err := newCA()
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, "other-ca-*.pem")
	if err != nil {
		return "", err
	}
	_, err = f.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der}))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	return f.Name(), nil
}

type keyPair struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

func newCA() (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &keyPair{cert: cert, der: der, key: key}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// writeServerTLS makes a CA and a server certificate for 127.0.0.1 signed by
// it, and writes ca.pem, server.pem and server.key into dir.
func writeServerTLS(dir string) (*tlsFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := newCA()
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	f := &tlsFiles{
		caFile:   filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "server.pem"),
		keyFile:  filepath.Join(dir, "server.key"),
	}
	for _, w := range []struct {
		path string
		typ  string
		der  []byte
	}{{f.caFile, "CERTIFICATE", ca.der}, {f.certFile, "CERTIFICATE", der}, {f.keyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), 0o600); err != nil {
			return nil, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	f.client = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if f.client.RootCAs == nil {
		return nil, errors.New("no CA pool")
	}
	return f, nil
}
