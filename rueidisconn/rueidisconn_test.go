package rueidisconn

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/conntest"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	// rueidis closes the connections of nodes that left a cluster's topology 5 s later, from
	// a goroutine of its own that outlives Close.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

func dial(t *testing.T, url string, opts ...DialOption) conn.Conn {
	t.Helper()
	c, err := Dial(conntest.Ctx(t, 10*time.Second), url, opts...)
	if err != nil {
		t.Fatalf("Dial(%s): %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestWait: see conntest.Wait.
func TestWait(t *testing.T) {
	conntest.Wait(t, func(t *testing.T, url string) conn.Conn { return dial(t, url) })
}

func TestClusterFlag(t *testing.T) {
	s := redistest.Start(t)
	if c := dial(t, s.URL()); c.(conn.Clustered).Cluster() {
		t.Error("a single server reports Cluster() = true")
	}
}

func TestParseSentinelURL(t *testing.T) {
	opt, err := ParseURL("redis+sentinel://u:p%40ss@127.0.0.1:1,127.0.0.1:2,h3/my%20master/3")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(opt.InitAddress, ","); got != "127.0.0.1:1,127.0.0.1:2,h3:26379" {
		t.Errorf("addresses %s", got)
	}
	if opt.Sentinel.MasterSet != "my master" || opt.SelectDB != 3 || opt.Username != "u" || opt.Password != "p@ss" {
		t.Errorf("master %q db %d user %q password %q", opt.Sentinel.MasterSet, opt.SelectDB, opt.Username, opt.Password)
	}
	if opt.TLSConfig != nil || opt.Sentinel.Username != "" {
		t.Error("plain URL got TLS or Sentinel credentials")
	}
	opt, err = ParseURL("rediss+sentinel://127.0.0.1:1/m")
	if err != nil || opt.TLSConfig == nil || opt.Sentinel.TLSConfig == nil || opt.SelectDB != 0 {
		t.Errorf("rediss+sentinel: %v, %+v", err, opt.TLSConfig)
	}
	for _, bad := range []string{
		"redis+sentinel://127.0.0.1:1",
		"redis+sentinel://127.0.0.1:1/",
		"redis+sentinel://127.0.0.1:1,/m",
		"redis+sentinel://u:secret@127.0.0.1:1/m/x",
		"redis+sentinel://127.0.0.1:1/m?x=1",
	} {
		_, err := ParseURL(bad)
		if err == nil {
			t.Errorf("ParseURL(%q) succeeded", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("error shows the password: %v", err)
		}
	}
	// Seeds of a cluster: rueidis' addr form.
	opt, err = ParseURL("redis://127.0.0.1:1?addr=127.0.0.1:2&addr=127.0.0.1:3")
	if err != nil || strings.Join(opt.InitAddress, ",") != "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3" {
		t.Errorf("cluster seeds: %v %v", opt.InitAddress, err)
	}
}

func TestTLS(t *testing.T) {
	s := redistest.Start(t, redistest.WithTLS())
	c := dial(t, s.URL(), WithTLSConfig(s.TLSConfig()))
	if _, err := c.Eval(conntest.Ctx(t, 10*time.Second), conntest.SetScript, []string{"k"}, []string{"v"}); err != nil {
		t.Fatal(err)
	}
	if got := conntest.MustDo(t, s, "GET", "k"); got != "v" {
		t.Errorf("GET k = %q", got)
	}
	// The system roots do not know the test CA.
	_, err := Dial(conntest.Ctx(t, 10*time.Second), s.URL())
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Dial without the CA: %v, want a certificate error", err)
	}
	_, err = Dial(conntest.Ctx(t, 10*time.Second), s.URL(), WithTLSConfig(&tls.Config{}))
	if err == nil || !strings.Contains(err.Error(), s.Addr) {
		t.Errorf("Dial with empty TLS config: %v, want an error naming %s", err, s.Addr)
	}
}

// TestSentinel: a client dialled with a Sentinel URL keeps working across failovers, on the
// new master. The data servers know the dlock user with docs/SECURITY.md's rule for Sentinel.
func TestSentinel(t *testing.T) {
	g := redistest.NewSentinel(t, redistest.WithArgs(redistest.ACLUserArgs(conntest.ACLUser, conntest.ACLPassword, conntest.SentinelRule()...)...))
	conntest.Sentinel(t, g, dial(t, conntest.WithUser(g.URL())))
}

// TestClusterPubSubAndWait: see conntest.Cluster. Every node knows the dlock user with
// docs/SECURITY.md's rule for Cluster.
func TestClusterPubSubAndWait(t *testing.T) {
	g := redistest.NewCluster(t, redistest.WithArgs(redistest.ACLUserArgs(conntest.ACLUser, conntest.ACLPassword, conntest.ClusterRule()...)...))
	c := dial(t, conntest.WithUser(g.URL()))
	if !c.(conn.Clustered).Cluster() {
		t.Fatal("Cluster() = false on a cluster")
	}
	conntest.Cluster(t, conntest.Ctx(t, 120*time.Second), g, c)
}
