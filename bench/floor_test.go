package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// The minimal FIFO handoff grants in arrival order, with strictly increasing tokens, and a
// waiter that gives up leaves the queue without stalling the next one.
func TestMinimalFIFOHandoff(t *testing.T) {
	srv, err := startServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := fifoContender.open(ctx, srv.Addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.close()
	fc := cl.(*fifoClient)
	first := fc.tokenMutex("n")
	tok0, unlock0, err := first(ctx)
	if err != nil {
		t.Fatal(err)
	}
	queueLen := func() int64 {
		n, err := srv.admin.LLen(ctx, "fifo:{n}:q").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitQueue := func(want int64) {
		for deadline := time.Now().Add(10 * time.Second); queueLen() != want; {
			if time.Now().After(deadline) {
				t.Fatalf("queue length %d, want %d", queueLen(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Three waiters queue one after the other; the second gives up before its turn.
	type grant struct {
		who int
		tok uint64
	}
	grants := make(chan grant, 3)
	errs := make(chan error, 3)
	giveUp, stopWaiting := context.WithCancel(ctx)
	for who := range 3 {
		lock := fc.tokenMutex("n")
		wctx := ctx
		if who == 1 {
			wctx = giveUp
		}
		go func() {
			tok, unlock, err := lock(wctx)
			if err != nil {
				errs <- err
				return
			}
			grants <- grant{who, tok}
			errs <- unlock(ctx)
		}()
		waitQueue(int64(who + 1))
	}
	stopWaiting()
	if err := <-errs; err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("the waiter that gave up: %v", err)
	}
	waitQueue(2)
	if err := unlock0(ctx); err != nil {
		t.Fatal(err)
	}
	last := tok0
	for _, want := range []int{0, 2} {
		select {
		case g := <-grants:
			if g.who != want || g.tok <= last {
				t.Fatalf("grant to waiter %d with token %d after token %d, want waiter %d and a larger token", g.who, g.tok, last, want)
			}
			last = g.tok
		case <-ctx.Done():
			t.Fatal("no grant")
		}
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := srv.admin.Exists(ctx, "fifo:{n}").Result(); n != 0 {
		t.Errorf("the lock is still held after the last release")
	}
}

// The floors' sections run and print their tables (tiny durations).
func TestFloorSections(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and worker processes")
	}
	srv, err := startServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cfg := defaultConfig(true)
	cfg.log = io.Discard
	cfg.floor.ringDuration = 200 * time.Millisecond
	cfg.floor.duration = 400 * time.Millisecond
	ring := floorRingSection(srv, cfg)
	t.Log(ring)
	for _, want := range []string{"| raw RESP | ", "| rueidis | "} {
		if !strings.Contains(ring, want) || strings.Contains(ring, want+"error") {
			t.Errorf("ring section lacks a figure for %q", want)
		}
	}
	fl, ok := floorClientsSection(srv, cfg)
	t.Log(fl)
	if !ok {
		t.Error("dlock or the minimal FIFO handoff failed or broke mutual exclusion")
	}
	for _, want := range []string{"| 1 server, 10 clients × 1, empty | minimal FIFO handoff | ", "| 1 server, 10 clients × 1, 1 ms held | dlock (rueidis) | "} {
		if !strings.Contains(fl, want) || strings.Contains(fl, want+"error") {
			t.Errorf("floor table lacks a figure for %q", want)
		}
	}
	sp, err := startSpinner(2)
	if err != nil {
		t.Fatal(err)
	}
	sp.stop()
}
