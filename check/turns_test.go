package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A turn row's schedule: its plain variants in their order, with a between-holds fault after
// each round of them; the pauses and cuts still past the TTL.
func TestPlanTurnFaults(t *testing.T) {
	ttl := 500 * time.Millisecond
	for _, c := range []struct {
		scenario string
		want     []string
	}{
		{"turn-pause", []string{"before-write", "after-read", variantBetween}},
		{"turn-kill", []string{"", variantBetween}},
		{"turn-partition", []string{"", variantBetween}},
	} {
		sc, ok := scenarioNamed(c.scenario)
		if !ok || sc.turnSlice != turnSlice {
			t.Fatalf("%s: no turn row", c.scenario)
		}
		if n := sc.faults(options{minFaults: 1}); n < len(c.want) {
			t.Errorf("%s: %d faults at least, want a whole round of %d", c.scenario, n, len(c.want))
		}
		sch := newSchedule(runConf{Scenario: c.scenario, Seed: 3})
		for n := range 12 {
			p := sch.next(sc.fault, ttl)
			if want := c.want[n%len(c.want)]; p.variant != want {
				t.Fatalf("%s fault %d: variant %q, want %q", c.scenario, n, p.variant, want)
			}
			if c.scenario != "turn-kill" && p.dur <= ttl {
				t.Fatalf("%s fault %d: lasts %v, want past the TTL %v", c.scenario, n, p.dur, ttl)
			}
		}
	}
}

// A lock taken back from a parked turn (token + 1, the same goroutine, inside its own Lock
// call) is a local acquisition: mapped as a server token it would land at the turn's first
// grant, before the previous hold's checks, which would then look "held after the next grant".
func TestAnalyze_TakenBackFromParkedTurn(t *testing.T) {
	h := newHist("turn-pause", true)
	h.d.clocks = []clockSample{{mono: 0, real: 0}} // wall clock = CLOCK_MONOTONIC
	h.acq(w0, 500, 0, 1)                           // from the server at 0.5 ms
	h.chk(w0, 500, 2, true)
	h.rmw(w0, 500, 1, 0, 3, 5, true)
	h.chk(w0, 500, 5.5, true)
	h.unl(w0, 500, 6, 6.1)   // parked
	h.acq(w0, 501, 6.2, 6.3) // taken back by the same goroutine
	h.chk(w0, 501, 7, true)
	h.rmw(w0, 501, 2, 1, 8, 9, true)
	h.unl(w0, 501, 10, 10.1)
	f := analyze(h.d, 10*time.Second)
	if f.LocalHandoffs != 1 || f.TakenBack != 1 || f.LiveAfterNext != 0 || f.UnsureLive != 0 || len(f.Failures) != 0 {
		t.Fatalf("local handoffs %d (taken back %d), live after next %d, unsure %d, failures %q: want 1 (1), 0, 0, none",
			f.LocalHandoffs, f.TakenBack, f.LiveAfterNext, f.UnsureLive, f.Failures)
	}
	if c := handoffsCell(f); c != "1 (1 taken back by the unlocking goroutine)" {
		t.Fatalf("local handoffs cell %q", c)
	}
}

// A between-holds fault hit the process after that lease's Unlock: there was no holder to tell,
// so a pause of it without a lost-lock signal is no failure, and the faults cell counts it by
// where it found the lock, with the others' wait after one that found it parked.
func TestAnalyze_BetweenHoldsFaults(t *testing.T) {
	h := newHist("turn-pause", true)
	h.acq(w0, 10, 0, 1)
	h.rmw(w0, 10, 1, 0, 2, 3, true)
	h.unl(w0, 10, 4, 4.1)
	h.acq(w1, 30, 5, 520) // the parked lease ran out
	h.d.faults = []faultRec{
		{Kind: "turn-pause", Variant: turnParked, Slot: 0, Inc: 1, Token: 10, Start: msT(4.1)},
		{Kind: "turn-pause", Variant: turnReleased, Slot: 0, Inc: 1, Token: 10, Start: msT(4.2)},
	}
	f := analyze(h.d, 10*time.Second)
	if len(f.Failures) != 0 || f.TurnParked != 1 || f.TurnReleased != 1 || f.TurnHeld != 0 {
		t.Fatalf("failures %q, parked %d, released %d, held %d", f.Failures, f.TurnParked, f.TurnReleased, f.TurnHeld)
	}
	if f.TurnParkedWaitMax < 515*time.Millisecond || f.TurnParkedWaitMax > 516*time.Millisecond {
		t.Fatalf("others waited %v after the parked fault, want 515.9 ms", f.TurnParkedWaitMax)
	}
	if c := faultsCell(f); !strings.Contains(c, "1 parked, others waited ≤ 516 ms") {
		t.Fatalf("faults cell %q", c)
	}
	// The same pause in a hold (a plain variant) must have been told.
	h.d.faults[0].Variant = "after-read"
	if f := analyze(h.d, 10*time.Second); len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "never got a lost-lock signal") {
		t.Fatalf("failures %q", f.Failures)
	}
}

// The log tail a between-holds fault reads: it finds the Unlock of the lease, and tells a
// sibling's hold (acquired after it, not unlocked) from none.
func TestLogTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker-4.1.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log := func(e event) {
		b, _ := json.Marshal(e)
		if _, err := f.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	log(event{K: "acq", Tok: 9, Res: "ok", Slot: 4, Inc: 1, G: 0}) // before the tail's start
	fi, _ := f.Stat()
	tail := &logTail{path: path, off: fi.Size()}
	g1 := who{4, 1, 1}
	if _, ok := tail.unlock(g1, 10); ok || tail.holding(10) {
		t.Fatal("an Unlock or a hold in an empty tail")
	}
	log(event{K: "wr", Tok: 10, Res: "ok", Slot: 4, Inc: 1, G: 1})
	log(event{K: "unl", S: 5, R: 6, Tok: 10, Slot: 4, Inc: 1, G: 1})
	if e, ok := tail.unlock(g1, 10); !ok || e.R != 6 || tail.holding(10) {
		t.Fatalf("unlock %+v %v, holding %v: want the Unlock and no hold", e, ok, tail.holding(10))
	}
	log(event{K: "acq", Tok: 11, Res: "ok", Slot: 4, Inc: 1, G: 0})
	if !tail.holding(10) {
		t.Fatal("the sibling's hold of 11 not seen")
	}
	log(event{K: "unl", Tok: 11, Slot: 4, Inc: 1, G: 0})
	if tail.holding(10) {
		t.Fatal("a hold seen after its Unlock")
	}
}

// End to end, turn-kill: the kill between holds lands on a process that stopped itself right
// after its Unlock, and the checker found where the lock was; the lock is taken back from
// parked turns; no guarantee breaks, and the lock comes back within the kill bound.
func TestRun_TurnKillBetweenHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and five worker processes")
	}
	d, f := runForTest(t, runConf{
		Scenario: "turn-kill", Fenced: true, Seed: 1, Workers: 5, Goroutines: 2, TTL: 500 * time.Millisecond,
		Cycles: 60, MinFaults: 2, MaxRun: 40 * time.Second, Short: true,
	})
	if len(f.Failures) != 0 {
		t.Fatalf("failures: %q", f.Failures)
	}
	var between []string
	for _, flt := range d.faults {
		if isBetweenHolds(flt.Variant) {
			between = append(between, flt.Variant)
		}
	}
	if len(between) != 1 || (between[0] != turnParked && between[0] != turnHeld && between[0] != turnReleased) {
		t.Fatalf("faults between holds %q: want one, placed after a self-stop", between)
	}
	if f.TakenBack == 0 || f.Faults != 2 || len(f.Recovery) != 2 {
		t.Fatalf("taken back %d, faults %d, recoveries %v", f.TakenBack, f.Faults, f.Recovery)
	}
	t.Logf("between holds: %s; %d taken back of %d local handoffs; recovery %v", between[0], f.TakenBack, f.LocalHandoffs, f.Recovery)
}
