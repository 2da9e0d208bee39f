//go:build linux

package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// TestGracefulShutdown: a replica told to stop (SIGTERM) while a purchase holds its SKU's
// lock finishes that purchase (200, committed), then closes its lock client, which releases
// the lock (free at once, not after its 10 s lease), and exits 0. The log shows the order:
// requests drained, then the client closed.
func TestGracefulShutdown(t *testing.T) {
	redisURL := startRedis(t)
	r := startReplica(t, "r0", redisURL, filepath.Join(t.TempDir(), "shutdown.db"), "--fault-injection", "--ttl", "10s")
	seed(t, r, "widget", 10)
	if code := call(t, "POST", r.URL+"/admin/fault?hold=1500ms", nil); code != 200 {
		t.Fatalf("arm fault: %d", code)
	}
	type answer struct {
		code int
		body BuyResult
		err  error
	}
	bought := make(chan answer, 1)
	go func() {
		var a answer
		a.code, a.err = callErr("POST", r.URL+"/buy?sku=widget&qty=1", &a.body)
		bought <- a
	}()
	// The purchase holds the lock once the fault is under way.
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := r.statsErr()
		if err == nil && s.InFault == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("purchase not holding the lock within 20 s (stats %+v, %v)", s, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-bought:
		if a.err != nil || a.code != 200 || a.body.QtyLeft != 9 {
			t.Fatalf("purchase in flight at SIGTERM: %d %+v %v; want 200 leaving 9", a.code, a.body, a.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("purchase in flight at SIGTERM did not answer within 20 s")
	}
	select {
	case <-r.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("replica did not exit within 20 s of SIGTERM")
	}
	if code := r.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("replica exited %d:\n%s", code, r.tail(20))
	}
	log := r.tail(200)
	drained, closed := strings.Index(log, "requests drained"), strings.Index(log, "closing the lock client")
	if drained < 0 || closed < drained || strings.Contains(log, "client closed") || strings.Contains(log, "purchase failed") {
		t.Fatalf("log does not show requests drained, then the lock client closed, without failures:\n%s", log)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, redisURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Inspect(ctx, "sku:widget")
	if err != nil || info.Held {
		t.Fatalf("sku:widget after the replica exited: %+v, %v; want it released by Close, not left to its lease", info, err)
	}
}
