package goredisconn

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/conntest"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func dial(t *testing.T, url string) conn.Conn {
	t.Helper()
	o, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	o.ContextTimeoutEnabled = true
	rc := redis.NewClient(o)
	t.Cleanup(func() { rc.Close() })
	return New(rc)
}

// TestWait: see conntest.Wait.
func TestWait(t *testing.T) {
	conntest.Wait(t, dial)
}

func TestClusterFlag(t *testing.T) {
	s := redistest.Start(t)
	if c := dial(t, s.URL()); c.(conn.Clustered).Cluster() {
		t.Error("a single server reports Cluster() = true")
	}
}

// TestSentinel: a go-redis failover client keeps working across failovers, on the new master.
// The data servers know the dlock user with docs/SECURITY.md's rule for Sentinel.
func TestSentinel(t *testing.T) {
	g := redistest.NewSentinel(t, redistest.WithArgs(redistest.ACLUserArgs(conntest.ACLUser, conntest.ACLPassword, conntest.SentinelRule()...)...))
	rc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            g.MasterName(),
		SentinelAddrs:         g.SentinelAddrs(),
		Username:              conntest.ACLUser,
		Password:              conntest.ACLPassword,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { rc.Close() })
	conntest.Sentinel(t, g, New(rc))
}

// TestClusterPubSubAndWait: see conntest.Cluster. Every node knows the dlock user with
// docs/SECURITY.md's rule for Cluster.
func TestClusterPubSubAndWait(t *testing.T) {
	g := redistest.NewCluster(t, redistest.WithArgs(redistest.ACLUserArgs(conntest.ACLUser, conntest.ACLPassword, conntest.ClusterRule()...)...))
	rc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: g.Addrs(), Username: conntest.ACLUser, Password: conntest.ACLPassword, ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { rc.Close() })
	c := New(redis.UniversalClient(rc))
	if !c.(conn.Clustered).Cluster() {
		t.Fatal("Cluster() = false on a cluster")
	}
	conntest.Cluster(t, conntest.Ctx(t, 120*time.Second), g, c)
}
