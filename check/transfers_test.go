package main

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// Fenced, the ledger refuses a read or write that carries a token below the highest seen for
// either account, and applies a write to both accounts or neither; unfenced it applies
// everything and marks it stale.
func TestLedger_FencesBothAccounts(t *testing.T) {
	for _, fenced := range []bool{true, false} {
		t.Run(fmt.Sprint("fenced=", fenced), func(t *testing.T) {
			l, err := startLedger(fenced, 3)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			c, err := net.Dial("tcp", l.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			want := func(line, reply string) {
				t.Helper()
				if got := resCall(t, c, br, line); got != reply {
					t.Errorf("%s -> %q, want %q", line, got, reply)
				}
			}
			want("R 0 1 0 1 0 10 1 10", "ok 1000 1000 0")
			want("W 0 1 0 1 0 10 990 1 10 1010", "ok 0 0 0")
			want("R 1 1 0 1 1 20 2 20", "ok 1010 1000 0") // account 1 now seen at 20
			stale := "stale 0 0 0"
			if !fenced {
				stale = "ok 0 0 0"
			}
			want("W 0 1 0 2 0 10 900 1 10 1100", stale) // token 10 is below 20 for account 1
			l.mu.Lock()
			bal, ops := append([]int64(nil), l.bal...), append([]transferOp(nil), l.ops...)
			l.mu.Unlock()
			if fenced && (bal[0] != 990 || bal[1] != 1010) {
				t.Errorf("balances %v after a refused write, want [990 1010 ...]: both or neither", bal)
			}
			if last := ops[len(ops)-1]; !last.Stale || last.Accepted == fenced {
				t.Errorf("last op %+v: want stale, accepted %v", last, !fenced)
			}
		})
	}
}

// analyzeTransfers: fenced, a changed total or a lost update fails the run; unfenced it is
// measured; a paused holder that is never told fails where the row says mustSignal.
func TestAnalyzeTransfers(t *testing.T) {
	w0, w1 := who{0, 1, 0}, who{1, 1, 0}
	base := func(fenced bool) *runData {
		d := &runData{conf: runConf{Scenario: "multi-pause", Fenced: fenced, TTL: 500 * time.Millisecond}, start: 0, end: 10_000}
		d.transfers = &transferData{accounts: 2, final: []int64{1000, 1000}}
		return d
	}
	// w0 reads, w1 reads and writes, w0 writes late (a lost update: w1's write is overwritten).
	lost := func(d *runData) {
		d.transfers.ops = []transferOp{
			{T: 1, Op: 'R', W: w0, Seq: 1, A: 0, B: 1, TokA: 10, TokB: 10, ValA: 1000, ValB: 1000, Accepted: true},
			{T: 2, Op: 'R', W: w1, Seq: 1, A: 0, B: 1, TokA: 20, TokB: 20, ValA: 1000, ValB: 1000, Accepted: true},
			{T: 3, Op: 'W', W: w1, Seq: 1, A: 0, B: 1, TokA: 20, TokB: 20, ValA: 995, ValB: 1005, Accepted: true},
			{T: 4, Op: 'W', W: w0, Seq: 1, A: 0, B: 1, TokA: 10, TokB: 10, ValA: 1000, ValB: 999, Accepted: true, Stale: true},
		}
		d.transfers.final = []int64{1000, 999}
	}
	d := base(false)
	lost(d)
	f := analyzeTransfers(d)
	if len(f.Failures) != 0 || f.LostUpdates != 2 || f.Overlaps != 1 || f.StaleLanded != 1 {
		t.Errorf("unfenced: %+v; want 2 lost updates, 1 overlap, 1 stale landed, no failure", f)
	}
	d = base(true)
	lost(d)
	f = analyzeTransfers(d)
	if len(f.Failures) == 0 || !strings.Contains(strings.Join(f.Failures, "; "), "total") {
		t.Errorf("fenced with a changed total: failures %q", f.Failures)
	}
	// A fault on w0 (hit at 5, recorded at 6), w1 takes account 1 at 400 ms: recovered, but
	// w0 was never told.
	d = base(true)
	d.faults = []faultRec{{Slot: 0, Inc: 1, G: 0, Start: 6, End: 700e6}}
	d.transfers.hits = []transferHit{{T: 5, W: w0, A: 0, B: 1}}
	d.events = []event{{K: "acq", S: 300e6, R: 400e6, Res: "ok", Cause: "1,0", Slot: 1, Inc: 1}}
	f = analyzeTransfers(d)
	if len(f.Recovery) != 1 || f.Recovery[0] != 400*time.Millisecond-6 {
		t.Errorf("recovery %v, want the next acquisition of a hit account", f.Recovery)
	}
	if len(f.Failures) != 1 || !strings.Contains(f.Failures[0], "never told") {
		t.Errorf("failures %q, want the untold hit holder", f.Failures)
	}
	d.events = append(d.events, event{K: "sig", S: 500e6, Slot: 0, Inc: 1, G: 0})
	if f := analyzeTransfers(d); len(f.Failures) != 0 {
		t.Errorf("told holder: failures %q", f.Failures)
	}
}
