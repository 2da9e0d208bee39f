package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

func clusterClients(t *testing.T, g *redistest.ClusterGroup, opts ...dlock.ClientOption) map[string]*dlock.Client {
	t.Helper()
	r, err := dlock.Dial(context.Background(), g.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: g.Addrs(), ContextTimeoutEnabled: true})
	gr, err := dlock.New(goredisconn.New(rc), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		gr.Close()
		rc.Close()
	})
	return map[string]*dlock.Client{"rueidis": r, "goredis": gr}
}

// TestCluster_RenewalAcrossSlots: leases on names spread over every shard are renewed (the
// renewal loop cuts its batches at slot boundaries; a cross-slot call would fail) through
// several periods, and each is exclusive.
func TestCluster_RenewalAcrossSlots(t *testing.T) {
	g := redistest.NewCluster(t)
	ctx := ctxT(t)
	// A lease long enough that a renewal round over three masters fits in a third of it on a
	// busy machine; a short one made this test measure the machine's load.
	for tr, c := range clusterClients(t, g, dlock.WithTTL(1500*time.Millisecond)) {
		t.Run(tr, func(t *testing.T) {
			var held []*dlock.Lease
			slots := map[int]bool{}
			for i := range 300 {
				name := fmt.Sprintf("%s-%d", uniqueName(t), i)
				slots[redistest.SlotOf(keyOf(name))] = true
				l, err := c.Mutex(name).TryLock(ctx)
				if err != nil {
					t.Fatalf("TryLock %s: %v", name, err)
				}
				held = append(held, l)
			}
			// Three renewal periods and more: a lease whose renewal failed would be lost by then.
			deadline := time.Now().Add(2 * time.Second)
			for time.Now().Before(deadline) {
				for _, l := range held {
					if err := l.Context().Err(); err != nil {
						t.Fatalf("lease %s lost: %v", l.Name(), context.Cause(l.Context()))
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			if _, err := c.Mutex(held[0].Name()).TryLock(context.Background()); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("TryLock of a held lock = %v, want ErrNotAcquired", err)
			}
			for _, l := range held {
				if err := l.Unlock(ctx); err != nil {
					t.Fatalf("Unlock %s: %v", l.Name(), err)
				}
			}
			t.Logf("300 leases over %d slots renewed through 4 periods", len(slots))
		})
	}
}

// TestCluster_MigrationAndFailover: a lock held while its slot migrates to another shard, and
// then while that shard fails over (CLUSTER FAILOVER), either stays held and exclusive, or
// its holder is told it was lost: never held by two.
func TestCluster_MigrationAndFailover(t *testing.T) {
	g := redistest.NewCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients := clusterClients(t, g, dlock.WithTTL(time.Second))
	other := clusterClients(t, g, dlock.WithTTL(time.Second))
	for tr, c := range clients {
		name := "migrate-" + tr
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slot := redistest.SlotOf(keyOf(name))
		check := func(step string) {
			t.Helper()
			// Let renewals run against the new topology for more than a lease.
			time.Sleep(1200 * time.Millisecond)
			_, terr := other[tr].Mutex(name).TryLock(ctx)
			live := l.Context().Err() == nil
			switch {
			case live && terr == nil:
				t.Fatalf("%s, %s: held by two clients", tr, step)
			case live && !errors.Is(terr, dlock.ErrNotAcquired):
				t.Fatalf("%s, %s: other client's TryLock: %v", tr, step, terr)
			case !live && !errors.Is(context.Cause(l.Context()), dlock.ErrLost):
				t.Fatalf("%s, %s: lease ended with %v, want ErrLost", tr, step, context.Cause(l.Context()))
			}
			t.Logf("%s, %s: lease live=%v (other client: %v)", tr, step, live, terr)
		}
		owner, err := g.MasterOfSlot(ctx, slot)
		if err != nil {
			t.Fatal(err)
		}
		var to *redistest.Server
		for _, m := range g.Masters() {
			if m != owner {
				to = m
				break
			}
		}
		if err := g.MigrateSlot(ctx, slot, to); err != nil {
			t.Fatal(err)
		}
		check("after slot migration")
		shard := -1
		for i, m := range g.Masters() {
			if m == to {
				shard = i
			}
		}
		if _, _, err := g.FailoverShard(ctx, shard); err != nil {
			t.Fatal(err)
		}
		check("after CLUSTER FAILOVER")
		if l.Context().Err() == nil {
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("%s: Unlock: %v", tr, err)
			}
		}
	}
}

// On a Redis Cluster, through either transport: for a lock on each shard, a waiter in another
// client is woken by the release (sharded pub/sub), long before the holder's lease would have
// run out. Every node knows the dlock user with docs/SECURITY.md's rule for Cluster.
func TestCluster_WakeOnEveryShard(t *testing.T) {
	rule := append(append([]string(nil), redistest.ACLRule...), redistest.ACLClusterExtra...)
	g := redistest.NewCluster(t, redistest.WithArgs(redistest.ACLUserArgs(testUser, testPassword, rule...)...))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := strings.Replace(g.URL(), "://", "://"+testUser+":"+testPassword+"@", 1)

	dial := map[string]func() *dlock.Client{
		"rueidis": func() *dlock.Client {
			c, err := dlock.Dial(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		},
		"goredis": func() *dlock.Client {
			rc := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs: g.Addrs(), Username: testUser, Password: testPassword, ContextTimeoutEnabled: true,
			})
			c, err := dlock.New(goredisconn.New(rc))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				c.Close()
				rc.Close()
			})
			return c
		},
	}
	masters := g.Masters()
	for _, tr := range []string{"rueidis", "goredis"} {
		holder, waiter := dial[tr](), dial[tr]()
		var names []string
		for i, m := range masters {
			// A name whose slot this master owns.
			for n := 0; ; n++ {
				cand := fmt.Sprintf("%s-shard%d-%d", tr, i, n)
				if owner, err := g.MasterOfSlot(ctx, redistest.SlotOf(cand)); err == nil && owner == m {
					names = append(names, cand)
					break
				}
			}
		}
		// Names that start with a brace: the key must still share its slot with the channel.
		names = append(names, "}"+tr, "{"+tr, "}}"+tr+"{")
		for i, name := range names {
			m, err := g.MasterOfSlot(ctx, redistest.SlotOf(keyOf(name)))
			if err != nil {
				t.Fatal(err)
			}
			const ttl = 20 * time.Second
			l, err := holder.Mutex(name, dlock.WithTTL(ttl)).Lock(ctx)
			if err != nil {
				t.Fatalf("%s shard %d: Lock: %v", tr, i, err)
			}
			got := make(chan error, 1)
			go func() {
				w, err := waiter.Mutex(name).Lock(ctx)
				if err == nil {
					err = w.Unlock(ctx)
				}
				got <- err
			}()
			// Release once the waiter's client is subscribed on the shard's master.
			waitFor(t, 20*time.Second, fmt.Sprintf("%s shard %d: the waiter to subscribe on %s", tr, i, m.Addr), func(context.Context) error {
				if out := redisDo(t, m, "PUBSUB", "SHARDCHANNELS", keyOf(name)+":rel:*"); strings.TrimSpace(out) == "" {
					return errors.New("PUBSUB SHARDCHANNELS: no waiting client's channel")
				}
				return nil
			})
			released := time.Now()
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("%s shard %d: Unlock: %v", tr, i, err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("%s shard %d: waiter: %v", tr, i, err)
				}
				t.Logf("%s shard %d (%s): waiter woke %v after the release", tr, i, m.Addr, time.Since(released))
			case <-time.After(ttl / 2):
				t.Fatalf("%s shard %d: waiter not woken %v after the release", tr, i, ttl/2)
			}
		}
	}

	// Every master's memory policy is read: one master that can evict keys makes Dial and New
	// refuse, naming it.
	m := masters[len(masters)-1]
	redisDo(t, m, "CONFIG", "SET", "maxmemory", "64mb")
	redisDo(t, m, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: g.Addrs(), Username: testUser, Password: testPassword, ContextTimeoutEnabled: true})
	defer rc.Close()
	_, port, _ := strings.Cut(m.Addr, ":")
	cGoRedis, errGoRedis := dlock.New(goredisconn.New(rc))
	cRueidis, errRueidis := dlock.Dial(ctx, url)
	for tr, r := range map[string]struct {
		c   *dlock.Client
		err error
	}{"rueidis": {cRueidis, errRueidis}, "goredis": {cGoRedis, errGoRedis}} {
		if r.c != nil {
			r.c.Close()
		}
		if !errors.Is(r.err, dlock.ErrEvictionPolicy) || !strings.Contains(fmt.Sprint(r.err), ":"+port) {
			t.Errorf("%s: a Cluster with master %s able to evict keys = %v, want ErrEvictionPolicy naming it", tr, m.Addr, r.err)
		}
	}
}
