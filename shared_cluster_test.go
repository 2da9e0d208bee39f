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

// On a Cluster, as the ACL user of docs/SECURITY.md: a read-write lock and a semaphore on a
// name of every shard (and names that start with a brace) keep all their keys in one slot, a
// release grants the units to a waiter of another client woken over sharded pub/sub on that
// shard, and the holds of names over many slots are renewed through several lease periods.
func TestCluster_RWMutexAndSemaphore(t *testing.T) {
	rule := append(append([]string(nil), redistest.ACLRule...), redistest.ACLClusterExtra...)
	g := redistest.NewCluster(t, redistest.WithArgs(redistest.ACLUserArgs(testUser, testPassword, rule...)...))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := strings.Replace(g.URL(), "://", "://"+testUser+":"+testPassword+"@", 1)
	dial := map[string]func(opts ...dlock.ClientOption) *dlock.Client{
		"rueidis": func(opts ...dlock.ClientOption) *dlock.Client {
			c, err := dlock.Dial(ctx, url, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		},
		"goredis": func(opts ...dlock.ClientOption) *dlock.Client {
			rc := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs: g.Addrs(), Username: testUser, Password: testPassword, ContextTimeoutEnabled: true,
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
		},
	}
	for _, tr := range []string{"rueidis", "goredis"} {
		holder, waiter := dial[tr](dlock.WithTTL(20*time.Second)), dial[tr]()
		var names []string
		for i, m := range g.Masters() {
			for n := 0; ; n++ {
				cand := fmt.Sprintf("%s-rw-shard%d-%d", tr, i, n)
				if owner, err := g.MasterOfSlot(ctx, redistest.SlotOf(cand)); err == nil && owner == m {
					names = append(names, cand)
					break
				}
			}
		}
		names = append(names, "}"+tr+"-rw", "{"+tr+"-rw")
		for i, name := range names {
			m, err := g.MasterOfSlot(ctx, redistest.SlotOf(keyOf(name)))
			if err != nil {
				t.Fatal(err)
			}
			for _, kind := range []string{"rw", "sem"} {
				var l *dlock.Lease
				if kind == "rw" {
					l, err = holder.RWMutex(name).RLock(ctx)
				} else {
					l, err = holder.Semaphore(name, 2).Acquire(ctx, 2)
				}
				if err != nil {
					t.Fatalf("%s %s shard %d: %v", tr, kind, i, err)
				}
				got := make(chan error, 1)
				go func() {
					var w *dlock.Lease
					var err error
					if kind == "rw" {
						w, err = waiter.RWMutex(name).Lock(ctx)
					} else {
						w, err = waiter.Semaphore(name, 2).Acquire(ctx, 1)
					}
					if err == nil {
						err = w.Unlock(ctx)
					}
					got <- err
				}()
				waitFor(t, 20*time.Second, fmt.Sprintf("%s %s shard %d: the waiter to subscribe on %s", tr, kind, i, m.Addr), func(context.Context) error {
					if out := redisDo(t, m, "PUBSUB", "SHARDNUMSUB", keyOf(name)+":"+kind+":rel"); !strings.HasSuffix(out, "\n1") {
						return fmt.Errorf("PUBSUB SHARDNUMSUB: %q", out)
					}
					return nil
				})
				released := time.Now()
				if err := l.Unlock(ctx); err != nil {
					t.Fatalf("%s %s shard %d: Unlock: %v", tr, kind, i, err)
				}
				select {
				case err := <-got:
					if err != nil {
						t.Fatalf("%s %s shard %d: waiter: %v", tr, kind, i, err)
					}
					t.Logf("%s %s shard %d (%s): granted %v after the release", tr, kind, i, m.Addr, time.Since(released))
				case <-time.After(10 * time.Second):
					t.Fatalf("%s %s shard %d: waiter not granted 10 s after the release (lease 20 s)", tr, kind, i)
				}
			}
		}
		// Renewals cut at slot boundaries: read holds and permits on 60 names, through more
		// than three lease periods.
		c := dial[tr](dlock.WithTTL(time.Second))
		var held []*dlock.Lease
		for i := range 60 {
			name := fmt.Sprintf("%s-renew-%d", tr, i)
			var l *dlock.Lease
			var err error
			if i%2 == 0 {
				l, err = c.RWMutex(name).RLock(ctx)
			} else {
				l, err = c.Semaphore(name, 3).Acquire(ctx, 2)
			}
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		for deadline := time.Now().Add(3500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			for _, l := range held {
				if l.Context().Err() != nil {
					t.Fatalf("%s: hold on %s lost: %v", tr, l.Name(), context.Cause(l.Context()))
				}
			}
		}
		for _, l := range held {
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}
