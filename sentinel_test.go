package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisconn"
)

// sentinelTransports make clients that find the master through the Sentinels.
var sentinelTransports = []struct {
	name string
	dial func(t testing.TB, g *redistest.SentinelGroup, opts ...dlock.ClientOption) *dlock.Client
}{
	{"rueidis-url", func(t testing.TB, g *redistest.SentinelGroup, opts ...dlock.ClientOption) *dlock.Client {
		t.Helper()
		c, err := dlock.Dial(context.Background(), g.URL(), opts...)
		if err != nil {
			t.Fatalf("Dial(%s): %v", g.URL(), err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}},
	{"rueidis", func(t testing.TB, g *redistest.SentinelGroup, opts ...dlock.ClientOption) *dlock.Client {
		t.Helper()
		cn, err := rueidisconn.DialOptions(context.Background(), rueidis.ClientOption{
			InitAddress: g.SentinelAddrs(),
			Sentinel:    rueidis.SentinelOption{MasterSet: g.MasterName()},
		})
		if err != nil {
			t.Fatal(err)
		}
		c, err := dlock.New(cn, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.Close()
			cn.Close()
		})
		return c
	}},
	{"goredis", func(t testing.TB, g *redistest.SentinelGroup, opts ...dlock.ClientOption) *dlock.Client {
		t.Helper()
		rc := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            g.MasterName(),
			SentinelAddrs:         g.SentinelAddrs(),
			ContextTimeoutEnabled: true,
		})
		c, err := dlock.New(goredisconn.New(rc), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.Close()
			rc.Close()
		})
		return c
	}},
}

// TestSentinel_FollowsFailover: clients made through the Sentinels keep taking locks after
// the master is killed and a replica promoted; a lease held with replica acknowledgement
// survives the failover (the promoted replica had it), and nobody else can take that lock.
func TestSentinel_FollowsFailover(t *testing.T) {
	g := redistest.NewSentinel(t)
	ctx := ctxT(t)
	type held struct {
		c *dlock.Client
		l *dlock.Lease
	}
	var leases []held
	for _, tr := range sentinelTransports {
		c := tr.dial(t, g, dlock.WithTTL(5*time.Second), dlock.WithReplicaAck(1, time.Second))
		l, err := c.Mutex("sentinel-" + tr.name).Lock(ctx)
		if err != nil {
			t.Fatalf("%s: Lock before failover: %v", tr.name, err)
		}
		leases = append(leases, held{c, l})
	}
	start := time.Now()
	old, promoted, err := g.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover %s -> %s took %v", old.Addr, promoted.Addr, time.Since(start))
	for i, tr := range sentinelTransports {
		h := leases[i]
		// The client finds the new master: a new lock succeeds within the retry window.
		var l *dlock.Lease
		waitFor(t, 15*time.Second, tr.name+": a lock on the new master", func(ctx context.Context) error {
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			var err error
			l, err = h.c.Mutex(uniqueName(t)).TryLock(tctx)
			return err
		})
		l.Unlock(ctx)
		// The acknowledged lease is on the new master: still ours, and exclusive.
		if err := h.l.Context().Err(); err != nil {
			t.Fatalf("%s: acknowledged lease lost in the failover: %v", tr.name, context.Cause(h.l.Context()))
		}
		if _, err := h.c.Mutex("sentinel-" + tr.name).TryLock(context.Background()); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("%s: TryLock of the held lock after failover = %v, want ErrNotAcquired", tr.name, err)
		}
		if err := h.l.Unlock(ctx); err != nil {
			t.Fatalf("%s: Unlock after failover: %v", tr.name, err)
		}
	}
}

// TestReplicaAck: without an acknowledging replica, an acquisition is rolled back and fails
// with ErrReplicaAck, and a held lease whose renewals are not acknowledged is lost.
func TestReplicaAck(t *testing.T) {
	g := redistest.NewSentinel(t)
	ctx := ctxT(t)
	for _, tr := range sentinelTransports[1:] {
		t.Run(tr.name, func(t *testing.T) {
			c := tr.dial(t, g, dlock.WithTTL(600*time.Millisecond), dlock.WithReplicaAck(1, 100*time.Millisecond))
			name := uniqueName(t)
			l, err := c.Mutex(name).Lock(ctx)
			if err != nil {
				t.Fatalf("Lock with replicas up: %v", err)
			}
			for _, r := range g.Replicas() {
				if err := r.Pause(); err != nil {
					t.Fatal(err)
				}
			}
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					for _, r := range g.Replicas() {
						r.Resume()
					}
				}
			}
			defer resume()
			// Renewals are no longer acknowledged: the lease is lost within its TTL.
			select {
			case <-l.Context().Done():
			case <-time.After(5 * time.Second):
				t.Fatal("lease with unacknowledged renewals not lost")
			}
			if !errors.Is(context.Cause(l.Context()), dlock.ErrLost) {
				t.Fatalf("cause %v, want ErrLost", context.Cause(l.Context()))
			}
			l.Unlock(ctx)
			other := uniqueName(t)
			_, err = c.Mutex(other).Lock(ctx)
			if !errors.Is(err, dlock.ErrReplicaAck) {
				t.Fatalf("Lock with replicas paused = %v, want ErrReplicaAck", err)
			}
			if v, _ := g.Master().Do(ctx, "GET", keyOf(other)); heldValue(v) {
				t.Fatalf("unacknowledged lock left on the master: %q", v)
			}
			resume()
			l2, err := c.Mutex(other).Lock(ctx)
			if err != nil {
				t.Fatalf("Lock after the replicas resumed: %v", err)
			}
			l2.Unlock(ctx)
		})
	}
}

func TestReplicaAck_InvalidInQuorumAndBadArgs(t *testing.T) {
	if _, err := dlock.NewQuorum([]dlock.Conn{nil}, dlock.WithReplicaAck(1, time.Second)); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("NewQuorum(nil conn) = %v, want ErrInvalid", err)
	}
	srv := startN(t, 3)
	q := quorumTransports[0].dial(t, serverAddrs(srv))
	if _, err := q.Mutex("x", dlock.WithReplicaAck(1, time.Second)).TryLock(ctxT(t)); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("quorum lock with replica ack = %v, want ErrInvalid", err)
	}
	for _, o := range []dlock.Option{dlock.WithReplicaAck(0, time.Second), dlock.WithReplicaAck(1, 0)} {
		if _, err := dlock.New(nil, o); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("bad WithReplicaAck = %v, want ErrInvalid", err)
		}
	}
}
