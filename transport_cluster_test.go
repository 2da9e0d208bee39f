package dlock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

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
				if out := redisDo(t, m, "PUBSUB", "SHARDNUMSUB", keyOf(name)+":rel"); !strings.HasSuffix(out, "\n1") {
					return fmt.Errorf("PUBSUB SHARDNUMSUB: %q", out)
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
}
