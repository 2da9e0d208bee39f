package main

import (
	"strings"
	"testing"
	"time"
)

// sharedHold logs a hold of units (-1: a writer) for cycle seq of w: acquired over [s, r],
// its context said "held" at each of live, unlocked at end.
func (h *hist) sharedHold(w who, seq int64, tok uint64, units int, s, r float64, live []float64, end float64) {
	ev := func(e event) {
		e.Slot, e.Inc, e.G, e.Seq, e.Tok = w.Slot, w.Inc, w.G, seq, tok
		h.d.events = append(h.d.events, e)
	}
	ev(event{K: "acq", S: msT(s), R: msT(r), Units: units, Res: "ok"})
	for _, at := range live {
		ev(event{K: "chk", S: msT(at), Live: true})
	}
	ev(event{K: "unl", S: msT(end), R: msT(end + 0.5)})
}

// Readers believed held together are fine; a writer believed held with a reader fails the run.
func TestAnalyzeShared_WriterWithReaderFails(t *testing.T) {
	h := newHist("rw-kill", true)
	h.sharedHold(w0, 1, 10, 1, 0, 1, []float64{2, 5}, 6)
	h.sharedHold(w1, 1, 10, 1, 0, 1.5, []float64{3, 4}, 6)
	h.sharedHold(w0b, 1, 20, -1, 1, 7, []float64{8, 9}, 10)
	if f := analyze(h.d, time.Second); len(f.Failures) != 0 || f.Cycles != 3 {
		t.Fatalf("readers together, then a writer alone: %+v", f)
	}
	h.sharedHold(w1, 2, 30, -1, 8, 8.5, []float64{8.8}, 11)
	f := analyze(h.d, time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "a writer with another holder") {
		t.Fatalf("two writers believed held at once: %v", f.Failures)
	}
}

// More permits believed held at once than the semaphore's size fails the run; as many does not.
func TestAnalyzeShared_OverSizeFails(t *testing.T) {
	h := newHist("sem-kill", false)
	h.sharedHold(w0, 1, 10, 2, 0, 1, []float64{2, 5}, 6)
	h.sharedHold(w1, 1, 11, 1, 0, 1.5, []float64{3, 4}, 6)
	if f := analyze(h.d, time.Second); len(f.Failures) != 0 {
		t.Fatalf("3 of 3 permits: %v", f.Failures)
	}
	h.sharedHold(w0b, 1, 12, 1, 2, 3, []float64{3.5}, 7)
	f := analyze(h.d, time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "more than 3 permits") {
		t.Fatalf("4 permits believed held at once: %v", f.Failures)
	}
}

// A hold a pause hit that was never told it was lost fails the run where the row says so.
func TestAnalyzeShared_HitHolderMustBeTold(t *testing.T) {
	h := newHist("sem-pause", false)
	h.sharedHold(w0, 1, 10, 1, 0, 1, []float64{2}, 900)
	h.d.faults = []faultRec{{Kind: "sem-pause", Slot: w0.Slot, Inc: w0.Inc, G: w0.G, Token: 10, Start: msT(3), End: msT(800)}}
	h.sharedHold(w1, 1, 11, 3, 501, 502, []float64{503}, 504) // recovery: the next acquisition
	f := analyze(h.d, time.Second)
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "never got a lost-lock signal") {
		t.Fatalf("an untold hit holder: %v", f.Failures)
	}
}

// Where the server forgets holds (a restart without persistence, a failover), holds believed
// held past the limits are the documented hazard: noted and counted, not failed; elsewhere the
// same history fails.
func TestAnalyzeShared_ForgottenHoldsNoted(t *testing.T) {
	for _, c := range []struct {
		scenario, forgets string
		units             int
	}{
		{"rw-restart", "rw-kill", -1},
		{"rw-sentinel-failover", "rw-kill", -1},
		{"sem-restart", "sem-kill", 2},
		{"sem-sentinel-failover", "sem-kill", 2},
	} {
		for _, name := range []string{c.scenario, c.forgets} {
			h := newHist(name, false)
			h.sharedHold(w0, 1, 10, c.units, 0, 1, []float64{2, 5}, 6)
			h.sharedHold(w1, 1, 20, c.units, 3, 3.5, []float64{4}, 7) // granted while w0's hold was believed held
			f := analyze(h.d, time.Second)
			if name == c.forgets {
				if len(f.Failures) != 1 {
					t.Errorf("%s: failures %v, want the limit broken", name, f.Failures)
				}
				continue
			}
			noted := false
			for _, n := range f.Notes {
				noted = noted || strings.Contains(n, "expected (the server lost the holds)")
			}
			if len(f.Failures) != 0 || !noted || f.LiveAfterNext != 2 {
				t.Errorf("%s: failures %v, notes %v, %d believed held over the limit; want none, a note, 2", name, f.Failures, f.Notes, f.LiveAfterNext)
			}
		}
	}
}
