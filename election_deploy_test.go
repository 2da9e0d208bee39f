package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// electionRound campaigns with a and b on one election (b queued behind a), resigns a and
// checks that b leads and that the observer o saw both terms in order, then resigns b.
func electionRound(t *testing.T, a, b, o *dlock.Client) {
	t.Helper()
	ctx := ctxT(t)
	name := uniqueName(t)
	obs := o.Election(name).Observe(ctx)
	observed(t, obs, 5*time.Second, "no leader at first", nobody)
	la, err := a.Election(name).Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	observed(t, obs, 5*time.Second, "a leads", leads("a"))
	bled := make(chan *dlock.Leadership, 1)
	go func() {
		lb, err := b.Election(name).Campaign(ctx, "b")
		if err != nil {
			t.Error(err)
		}
		bled <- lb
	}()
	waitFor(t, 10*time.Second, "b queued", func(ctx context.Context) error {
		in, err := o.Inspect(ctx, name)
		if err == nil && in.Waiters != 1 {
			err = errors.New("b not queued yet")
		}
		return err
	})
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-bled
	if lb == nil {
		t.FailNow()
	}
	if lb.Term() <= la.Term() {
		t.Fatalf("term %d after %d", lb.Term(), la.Term())
	}
	if got := observed(t, obs, 5*time.Second, "b leads", leads("b")); got.Term != lb.Term() {
		t.Fatalf("observed term %d, b has %d", got.Term, lb.Term())
	}
	if err := lb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	observed(t, obs, 5*time.Second, "nobody leads", nobody)
}

// Elections on a Cluster (announcements by SPUBLISH, on the shard of the name) and through
// Sentinel, through both transports.
func TestElection_ClusterAndSentinel(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		g := redistest.NewCluster(t)
		for tr, c := range clusterClients(t, g) {
			t.Run(tr, func(t *testing.T) {
				cs := clusterClients(t, g)
				electionRound(t, c, cs["rueidis"], cs["goredis"])
			})
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		g := redistest.NewSentinel(t)
		for _, tr := range sentinelTransports {
			t.Run(tr.name, func(t *testing.T) {
				electionRound(t, tr.dial(t, g), tr.dial(t, g), tr.dial(t, g))
			})
		}
	})
}

// Quorum mode has no elections: every call says so at once.
func TestElection_RefusedInQuorumMode(t *testing.T) {
	srv := startN(t, 3)
	for _, tr := range quorumTransports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := ctxT(t)
			c := tr.dial(t, serverAddrs(srv))
			e := c.Election(uniqueName(t))
			if _, err := e.Campaign(ctx, "v"); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("Campaign in quorum mode = %v, want ErrInvalid", err)
			}
			if _, err := e.Leader(ctx); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("Leader in quorum mode = %v, want ErrInvalid", err)
			}
			if _, ok := <-e.Observe(ctx); ok {
				t.Error("Observe in quorum mode sent a value")
			}
			if err := c.RunElected(ctx, "x", "v", func(context.Context) error { return nil }); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("RunElected in quorum mode = %v, want ErrInvalid", err)
			}
		})
	}
}
