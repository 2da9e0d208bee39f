package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// checkPingDown checks Ping's error for servers that are down: ErrUnavailable on one line,
// naming each of them.
func checkPingDown(t *testing.T, what string, err error, addrs ...string) {
	t.Helper()
	if !errors.Is(err, dlock.ErrUnavailable) || strings.Contains(fmt.Sprint(err), "\n") {
		t.Fatalf("%s: Ping = %v, want ErrUnavailable on one line", what, err)
	}
	for _, a := range addrs {
		if !strings.Contains(err.Error(), a) {
			t.Errorf("%s: Ping = %q, want it to name %s", what, err, a)
		}
	}
}

// One server: Ping passes while it is up, fails fast with ErrUnavailable naming it once it
// is killed, fails with ErrUnavailable and the context's error when it is frozen past the
// probe's deadline, and passes again once it is back. A closed client gets ErrClosed.
func TestPing_Standalone(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		s := redistest.Start(t)
		c := tr.dial(t, s.URL())
		ctx := ctxT(t)
		if err := c.Ping(ctx); err != nil {
			t.Fatalf("Ping of a live server = %v", err)
		}

		if err := s.Pause(); err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := c.Ping(pctx)
		cancel()
		s.Resume()
		checkPingDown(t, "frozen server", err, s.Addr)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Ping of a frozen server = %v, want context.DeadlineExceeded too", err)
		}
		waitFor(t, 10*time.Second, "Ping after Resume", c.Ping)

		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = c.Ping(dctx)
		cancel()
		checkPingDown(t, "killed server", err, s.Addr)
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("Ping of a killed server took %v: it should fail fast, not wait for the context", took)
		}
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "Ping after Restart", c.Ping)

		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Ping(ctx); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("Ping after Close = %v, want ErrClosed", err)
		}
		var nilClient *dlock.Client
		if err := nilClient.Ping(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Ping of a nil client = %v, want ErrInvalid", err)
		}
	})
}

// Quorum mode: Ping passes while a majority answers (all five up, one of five down) and,
// with three of five down, returns a *QuorumError (ErrNoQuorum, ErrUnavailable) that says
// what each server did. A closed quorum client gets ErrClosed.
func TestPing_Quorum(t *testing.T) {
	srv := startN(t, 5)
	clients := make([]*dlock.Client, len(quorumTransports))
	for i, tr := range quorumTransports {
		clients[i] = tr.dial(t, serverAddrs(srv))
	}
	ping := func(what string) []error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		errs := make([]error, len(clients))
		for i, c := range clients {
			errs[i] = c.Ping(ctx)
			if ctx.Err() != nil {
				t.Fatalf("%s: Ping through %s waited for its context", what, quorumTransports[i].name)
			}
		}
		return errs
	}
	for i, err := range ping("all up") {
		if err != nil {
			t.Fatalf("%s: Ping with all five up = %v", quorumTransports[i].name, err)
		}
	}
	srv[0].Kill()
	for i, err := range ping("one down") {
		if err != nil {
			t.Fatalf("%s: Ping with one of five down = %v, want nil (a majority answers)", quorumTransports[i].name, err)
		}
	}
	srv[1].Kill()
	srv[2].Kill()
	for i, err := range ping("three down") {
		tr := quorumTransports[i].name
		var qe *dlock.QuorumError
		if !errors.As(err, &qe) || !errors.Is(err, dlock.ErrNoQuorum) || !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("%s: Ping with three of five down = %v, want a *QuorumError (ErrNoQuorum, ErrUnavailable)", tr, err)
		}
		checkPingDown(t, tr+": three down", err, serverAddrs(srv)...)
		if qe.Op != "ping" || qe.Need != 3 || len(qe.Servers) != 5 {
			t.Fatalf("%s: QuorumError %+v, want op ping, need 3, five servers", tr, qe)
		}
		for j, st := range qe.Servers {
			want := "answered"
			if j < 3 {
				want = "error"
			}
			if st.Addr != srv[j].Addr || st.State != want || (want == "error") != (st.Err != nil) {
				t.Errorf("%s: server %d: %+v, want %s at %s", tr, j, st, want, srv[j].Addr)
			}
		}
		if !strings.Contains(err.Error(), "2 of 5 servers answered the ping, a majority needs 3") {
			t.Errorf("%s: Ping = %q, want it to say 2 of 5 answered and 3 are needed", tr, err)
		}
	}
	for i, c := range clients {
		c.Close()
		if err := c.Ping(context.Background()); !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("%s: Ping after Close = %v, want ErrClosed", quorumTransports[i].name, err)
		}
	}
}

// Cluster: Ping asks every master, so one frozen master fails it (ErrUnavailable naming that
// master) while the other two answer; the cluster is left alone long before its node timeout
// (5 s) could start a failover.
func TestPing_Cluster(t *testing.T) {
	g := redistest.NewCluster(t)
	frozen := g.Masters()[1]
	for tr, c := range clusterClients(t, g) {
		t.Run(tr, func(t *testing.T) {
			ctx := ctxT(t)
			if err := c.Ping(ctx); err != nil {
				t.Fatalf("Ping of a healthy cluster = %v", err)
			}
			if err := frozen.Pause(); err != nil {
				t.Fatal(err)
			}
			pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			err := c.Ping(pctx)
			cancel()
			frozen.Resume()
			checkPingDown(t, "one master frozen", err, frozen.Addr)
			// go-redis reloads the slot map from one node before it asks the masters: when it
			// picks the frozen one, the deadline passes for every master (documented on Ping).
			reloadStalled := tr == "goredis" && strings.Count(err.Error(), "context deadline exceeded") == len(g.Masters())
			for _, m := range g.Masters() {
				if m != frozen && strings.Contains(err.Error(), m.Addr) && !reloadStalled {
					t.Errorf("Ping = %q names %s, a master that answered", err, m.Addr)
				}
			}
			waitFor(t, 10*time.Second, "Ping after Resume", c.Ping)
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if err := c.Ping(ctx); !errors.Is(err, dlock.ErrClosed) {
				t.Fatalf("Ping after Close = %v, want ErrClosed", err)
			}
		})
	}
}
