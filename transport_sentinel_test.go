package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Behind Sentinel, through either transport: a client locks, the master is killed and a replica
// promoted, and the same client (not restarted) locks and unlocks again on the new master
// within 30 s of the failover's end. The data servers know the dlock user with
// docs/SECURITY.md's rule for Sentinel.
func TestSentinel_ClientFollowsFailover(t *testing.T) {
	rule := append(append([]string(nil), redistest.ACLRule...), redistest.ACLSentinelExtra...)
	g := redistest.NewSentinel(t, redistest.WithArgs(redistest.ACLUserArgs(testUser, testPassword, rule...)...))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rc, err := dlock.Dial(ctx, "redis+sentinel://"+testUser+":"+testPassword+"@"+g.URL()[len("redis+sentinel://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	gr := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: g.MasterName(), SentinelAddrs: g.SentinelAddrs(),
		Username: testUser, Password: testPassword, ContextTimeoutEnabled: true,
	})
	defer gr.Close()
	gc, err := dlock.New(goredisconn.New(gr))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	clients := map[string]*dlock.Client{"rueidis": rc, "goredis": gc}

	for tr, c := range clients {
		l, err := c.Mutex("before-"+tr, dlock.WithTTL(2*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatalf("%s: Lock before the failover: %v", tr, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("%s: Unlock before the failover: %v", tr, err)
		}
	}
	start := time.Now()
	_, promoted, err := g.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover to %s took %v", promoted.Addr, time.Since(start))
	for tr, c := range clients {
		// Calls may fail until the client has learnt of the new master; then they work, there.
		deadline := time.Now().Add(30 * time.Second)
		name := "after-" + tr
		for {
			tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
			l, err := c.Mutex(name, dlock.WithTTL(2*time.Second)).TryLock(tctx)
			tcancel()
			if err == nil {
				if v, _ := promoted.Do(ctx, "GET", "dlock:{"+name+"}"); v == "" {
					t.Errorf("%s: locked, but not on the new master %s", tr, promoted.Addr)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Errorf("%s: Unlock after the failover: %v", tr, err)
				}
				t.Logf("%s: locking again %v after the master was killed", tr, time.Since(start))
				break
			}
			if errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("%s: %s is held after the failover", tr, name)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no lock 30 s after the failover: %v", tr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
