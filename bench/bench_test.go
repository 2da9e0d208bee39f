package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary play the worker processes of scenarios 3 and 7, the crash-test
// holder of scenario 6 and the candidates of scenario 12, as the bench binary does.
func TestMain(m *testing.M) {
	runFloorChild()
	if len(os.Args) > 1 && os.Args[1] == holderFlag {
		os.Exit(runHolder(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == workerFlag {
		os.Exit(runWorker(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == rwWorkerFlag {
		os.Exit(runRWWorker(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == adaptiveHolderFlag {
		os.Exit(runAdaptiveHolder(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == electWorkerFlag {
		os.Exit(runElectWorker(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestHarness runs every scenario with tiny durations: it proves the harness, every contender
// and the table output work, not the figures.
func TestHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and runs every contender")
	}
	cfg := defaultConfig(true)
	cfg.reps = 1
	cfg.uncontendedGoroutines = []int{1, 4}
	cfg.uncontendedDuration = 50 * time.Millisecond
	cfg.warmUp = 10 * time.Millisecond
	cfg.hotDuration = 400 * time.Millisecond
	cfg.hotProcsDuration = time.Second // four processes dialling and contending from cold need a moment on a loaded machine
	cfg.redlockDuration = 100 * time.Millisecond
	cfg.renewalLeases = []int{300}
	cfg.renewalTTL = 300 * time.Millisecond
	cfg.renewalAcquire = 10 * time.Second
	cfg.crashTTL = 300 * time.Millisecond
	cfg.crashHold = 50 * time.Millisecond
	cfg.clientsDuration = 600 * time.Millisecond // ten processes dialling and contending from cold, as for scenario 3
	cfg.frozenTTLs = []time.Duration{500 * time.Millisecond}
	cfg.frozenTries = 1
	cfg.readMostlyDuration = 300 * time.Millisecond
	cfg.transfersDuration = 100 * time.Millisecond
	cfg.floor.ringDuration = 200 * time.Millisecond
	cfg.floor.duration = 400 * time.Millisecond
	cfg.adaptiveNames, cfg.adaptiveRun, cfg.adaptiveCrashAfter, cfg.adaptiveWaiters = 8, 1500*time.Millisecond, 300*time.Millisecond, true
	cfg.adaptiveWatchdog = 2 * time.Second // its waiters wait out the whole lease
	cfg.log = io.Discard
	cfg.plotDir = t.TempDir()
	cfg.plotLink = "img/" + plotFile
	out, ok, err := runScenarios(cfg, "go test")
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out)
	if !ok {
		t.Fatal("a dlock measurement failed or dlock broke mutual exclusion")
	}
	for _, want := range []string{"### 1.", "**1 goroutine, idle vCPUs**", "**4 goroutines, awake vCPUs (2 nice 19 spinners)**", "| vCPU halts/pair |", "**CPU state.**", "### 2.", "### 3.", "### 4.", "| dlock quorum (rueidis) | no fault |", "### 5.", "### 6.", "| one round trip per lease per period | 300 |", "| rueidislock |", "| raw rueidis |", "exact",
		"### 7.", "| 1 server, 10 clients × 1, 1 ms held | redislock, 1–10 ms linear |", "| 5 servers, 1 client × 10, empty | dlock quorum (rueidis) |",
		"| 1 server, 10 clients × 1, empty | dlock (rueidis), turn 200 µs |", "| 1 server, 10 clients × 1, 1 ms held | dlock (rueidis), turn 1 ms |",
		"| 7, 1 server, 10 clients × 1, empty | dlock (rueidis), turn 200 µs: holds/s ≥ 10× redsync |",
		"| 7, 1 server, 10 clients × 1, 1 ms held | dlock (rueidis), turn 1 ms: wait max ≤ 30 ms |",
		"- **dlock (rueidis), turn 1 ms**: as dlock (rueidis), with `dlock.WithTurnSlice(1ms)`",
		"| 1 server, 10 clients × 1, empty | minimal FIFO handoff |", "| 1 server, 10 clients × 1, 1 ms held | minimal FIFO handoff |",
		"| raw RESP | ", "| rueidis | ", "one pub/sub message around a ring of 10 processes",
		"3 of 5 servers frozen", "| dlock quorum (rueidis) | 500ms |", "| redsync | 500ms |",
		"### 8.", "**T = ", "| adaptive [100 ms, 10 s], renewed |", "(the adaptive's median recovery), renewed every ", "| watchdog: fixed 2 s, renewed every 666 ms |",
		"| adaptive [100 ms, 10 s], WithoutRenewal |", "| fixed 50 ms = the median hold, WithoutRenewal |", "| renewals ≤ 0.5× the fixed lease's, at equal recovery |",
		"### 9.", "| 4 | 16 |",
		"### 10.", "| read-mostly, 1ms holds | RWMutex: RLock / Lock |", "| permits | Semaphore of 64: Acquire(1) |"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if st, err := os.Stat(filepath.Join(cfg.plotDir, plotFile)); err != nil || st.Size() < 10_000 {
		t.Errorf("plot: %v (%v)", st, err)
	}
	// Peers may fail under load, even break exclusion (that is a finding for the table); dlock must not.
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		peer := rowNamesPeer(line)
		switch {
		case strings.Contains(line, "BROKEN") && peer:
			t.Logf("a peer broke exclusion (a finding, not a harness failure): %s", line)
		case strings.Contains(line, "BROKEN"):
			t.Errorf("dlock broke exclusion: %s", line)
		case strings.HasPrefix(line, "| dlock") && strings.Contains(line, "error"):
			t.Errorf("output reports a dlock failure: %s", line)
		}
	}
}

// rowNamesPeer reports whether a table row measures a peer or a raw floor rather than dlock: one
// of its cells is a contender's name that is not dlock's.
func rowNamesPeer(line string) bool {
	for _, cell := range strings.Split(line, "|") {
		cell = strings.TrimSpace(cell)
		if cell == "" || strings.HasPrefix(cell, "dlock") {
			continue
		}
		if c := contenderByName(cell); c != nil && c.kind != kindDlock {
			return true
		}
		for _, c := range quorumContenders {
			if c.name == cell && c.kind != kindDlock {
				return true
			}
		}
		for _, c := range frozenContenders {
			if c.name == cell {
				return true
			}
		}
	}
	return false
}

func TestRowNamesPeer(t *testing.T) {
	for _, tc := range []struct {
		line string
		want bool
	}{
		{"| 1 server, 10 clients × 1, 1 ms held | rueidislock | 563 | **BROKEN**: 1 overlapping holds of 242 |", true},
		{"| redsync | 5,400 | **BROKEN**: 3 lost updates, 0 overlaps |", true},
		{"| 1 server, 10 clients × 1, 1 ms held | dlock (rueidis) | 563 | **BROKEN**: 1 overlapping holds of 242 |", false},
		{"| dlock (go-redis) | 5,400 | **BROKEN**: 3 lost updates, 0 overlaps |", false},
		{"| read-mostly, 1ms holds | RWMutex: RLock / Lock | 3,777 | **BROKEN**: 2 of 900 |", false},
	} {
		if got := rowNamesPeer(tc.line); got != tc.want {
			t.Errorf("rowNamesPeer(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

func TestWriteSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "B.md")
	if err := os.WriteFile(path, []byte("# Benchmarks\n\nold text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeSection(path, "first\n"); err != nil {
		t.Fatal(err)
	}
	if err := writeSection(path, "second\n"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := "# Benchmarks\n\nold text\n\n" + markStart + "\nsecond\n" + markEnd + "\n"
	if string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}
	os.WriteFile(path, []byte("x\n"+markStart+"\n"), 0o644)
	if err := writeSection(path, "y"); err == nil {
		t.Error("unbalanced markers accepted")
	}
}

func TestJainAndMedian(t *testing.T) {
	if j, m := jain([]int64{5, 5, 5, 5}); j != 1 || m != 1 {
		t.Errorf("even counts: Jain %v, least served %v", j, m)
	}
	if j, _ := jain([]int64{8, 0, 0, 0}); j != 0.25 {
		t.Errorf("one goroutine served: Jain %v, want 0.25", j)
	}
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median %v", m)
	}
	if s := thousands(1234567.4); s != "1,234,567" {
		t.Errorf("thousands %q", s)
	}
	if s := thousands(-1210); s != "−1,210" {
		t.Errorf("thousands %q", s)
	}
}

func TestOverlaps(t *testing.T) {
	ok := []hold{{token: 1, acquired: 10, released: 20}, {token: 3, acquired: 30, released: 40}, {token: 2, acquired: 20, released: 25}}
	if n := overlaps(ok, true); n != 0 {
		t.Errorf("disjoint holds: %d overlaps", n)
	}
	if n := overlaps(ok, false); n != 0 {
		t.Errorf("disjoint holds by time: %d overlaps", n)
	}
	bad := []hold{{token: 1, acquired: 10, released: 20}, {token: 2, acquired: 15, released: 25}}
	if n := overlaps(bad, false); n != 1 {
		t.Errorf("overlapping holds: %d overlaps, want 1", n)
	}
	// Tokens out of time order: token 2 was acquired before token 1 was released.
	swapped := []hold{{token: 2, acquired: 10, released: 20}, {token: 1, acquired: 21, released: 30}}
	if n := overlaps(swapped, true); n != 1 {
		t.Errorf("tokens out of order: %d overlaps, want 1", n)
	}
	if n := overlaps([]hold{{token: 5, acquired: 1, released: 2}, {token: 5, acquired: 3, released: 4}}, true); n != 1 {
		t.Errorf("repeated token: %d overlaps, want 1", n)
	}
}

func TestClientsHelpers(t *testing.T) {
	r := &linearRamp{step: time.Millisecond, max: 10 * time.Millisecond}
	var got []time.Duration
	for range 12 {
		got = append(got, r.NextBackoff())
	}
	if got[0] != time.Millisecond || got[4] != 5*time.Millisecond || got[9] != 10*time.Millisecond || got[11] != 10*time.Millisecond {
		t.Errorf("linear ramp: %v", got)
	}
	s := shortAddrs(`lock "x" on quorum of 5 [127.0.0.1:1 127.0.0.1:22 127.0.0.1:333]: 127.0.0.1:4444: refused`)
	if want := `lock on quorum of 5 …: …: refused`; s != want {
		t.Errorf("shortAddrs: %q, want %q", s, want)
	}
	if s := oneLine(errors.New(strings.Repeat("é", 130))); s != strings.Repeat("é", 120)+"…" {
		t.Errorf("oneLine cut inside a character: %q", s)
	}
	if s := msText(time.Millisecond); s != "1 ms" {
		t.Errorf("msText: %q", s)
	}
	if r := aggregateClients([]hotProcsResult{{hotResult: hotResult{handoffs: 100, elapsed: time.Second, waitP99: 90 * time.Millisecond}}}, 10); r.p99Fair != 1 {
		t.Errorf("p99 ÷ fair share: %v, want 1 (9 other holds of 10 ms each)", r.p99Fair)
	}
}

// Scenario 10's check: a write overlapping any hold, or more holds than the size, is counted.
func TestReadMostlyCheck(t *testing.T) {
	readers := []rmHoldRec{{kind: 'r', acquired: 10, released: 20}, {kind: 'r', acquired: 15, released: 25}, {kind: 'w', acquired: 25, released: 30}}
	if most, v := rmCheck(readers, 64); v != 0 || most != 64 {
		t.Errorf("readers together, then a writer: most %d, %d violations", most, v)
	}
	if _, v := rmCheck(append(readers, rmHoldRec{kind: 'r', acquired: 28, released: 29}), 64); v != 1 {
		t.Errorf("a reader inside a write: %d violations, want 1", v)
	}
	permits := []rmHoldRec{{kind: 'p', acquired: 1, released: 5}, {kind: 'p', acquired: 2, released: 6}, {kind: 'p', acquired: 3, released: 7}}
	if most, v := rmCheck(permits, 2); v != 1 || most != 3 {
		t.Errorf("3 permits of 2: most %d, %d violations", most, v)
	}
}

// The turn contenders are found by name (the worker processes open them so) as dlock, and are
// judged by their own targets in the one-server cases only.
func TestTurnContenders(t *testing.T) {
	for slice, want := range map[time.Duration]string{turnShort: "dlock (rueidis), turn 200 µs", turnLong: "dlock (rueidis), turn 1 ms"} {
		if got := turnName(slice); got != want {
			t.Errorf("turnName(%v) = %q, want %q", slice, got, want)
		}
		if c := contenderByName(want); c == nil || c.kind != kindDlock {
			t.Errorf("contenderByName(%q) = %v, want a dlock contender", want, c)
		}
	}
	cases := clientsCases()
	rows := map[string]clientsRow{
		"dlock (rueidis)":   {rate: 2000, minShare: 1, p99Fair: 2, n: 3},
		"redsync":           {rate: 1000, minShare: 0.1, n: 3},
		turnName(turnShort): {rate: 10_000, minShare: 0.9, waitMax: 12, n: 3}, // 10×: met, fair, short waits
		turnName(turnLong):  {rate: 20_000, minShare: 0.4, waitMax: 31, n: 3}, // unfair, one wait too long
	}
	fig := newFigures()
	clientsTargets(fig, 0, cases[0], rows)
	verdicts := map[string]bool{}
	for _, r := range fig.targets {
		if strings.HasPrefix(r.target, "dlock (rueidis), turn") {
			verdicts[r.target] = r.met
		}
	}
	for target, met := range map[string]bool{
		"dlock (rueidis), turn 200 µs: holds/s ≥ 10× redsync":              true,
		"dlock (rueidis), turn 200 µs: every client ≥ half the mean holds": true,
		"dlock (rueidis), turn 200 µs: wait max ≤ 30 ms":                   true,
		"dlock (rueidis), turn 1 ms: holds/s ≥ 10× redsync":                true,
		"dlock (rueidis), turn 1 ms: every client ≥ half the mean holds":   false,
		"dlock (rueidis), turn 1 ms: wait max ≤ 30 ms":                     false,
	} {
		if got, ok := verdicts[target]; !ok || got != met {
			t.Errorf("target %q: met %v (recorded %v), want met %v", target, got, ok, met)
		}
	}
	if len(verdicts) != 6 {
		t.Errorf("%d turn targets recorded, want 6: %v", len(verdicts), verdicts)
	}
	// The quorum case: the strict handoff's targets, and the quorum turn contender's, each
	// judged on its own row.
	quorum := newFigures()
	clientsTargets(quorum, 2, cases[2], map[string]clientsRow{quorumContenders[0].name: {rate: 500, minShare: 1, n: 1},
		quorumTurn.name: {rate: 1600, minShare: 0.9, waitMax: 12, n: 1}, "redsync": {rate: 1000, n: 1}})
	qv := map[string]bool{}
	for _, r := range quorum.targets {
		qv[r.target] = r.met
	}
	for target, met := range map[string]bool{
		"holds/s ≥ 1.5× redsync":                                 false,
		quorumTurn.name + ": holds/s ≥ 1.5× redsync":             true,
		quorumTurn.name + ": every client ≥ half the mean holds": true,
		quorumTurn.name + ": wait max ≤ 30 ms":                   true,
	} {
		if got, ok := qv[target]; !ok || got != met {
			t.Errorf("quorum target %q: met %v (recorded %v), want met %v", target, got, ok, met)
		}
	}
}

// TestHarnessElection runs scenario 12, which is not in the default list, in quick mode with a
// short lease and two kills: every contender has its row, and only dlock's own failures fail it
// (a peer's error, overlap or missed bound is a finding in the table).
func TestHarnessElection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and candidate processes")
	}
	cfg := defaultConfig(true)
	cfg.scenarios = []int{12}
	cfg.electTTL = 500 * time.Millisecond // renewals keep up on a loaded machine: the only terms that end are the killed ones
	cfg.electKills = 2
	cfg.log = io.Discard
	out, ok, err := runScenarios(cfg, "go test")
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out)
	if !ok {
		t.Fatal("a dlock contender failed, or two of its leaders acted at once")
	}
	for _, want := range []string{"### 12.", "| contender | kills | median | p99 | max | median ÷ TTL |", "**Bound:** the next leader acts within TTL + 250 ms = 750 ms of every kill: ",
		"| 12, dlock Campaign (rueidis) | a SIGKILLed leader's successor acts ≤ TTL + 250 ms after the kill |",
		"redsync's default retry delay (random 50–250 ms between tries)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, c := range electContenders {
		row := ""
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "| "+c.name+" |") {
				row = line
			}
		}
		switch {
		case row == "":
			t.Errorf("no row for %s", c.name)
		case c.kind != kindDlock:
			t.Logf("peer row (any content is a finding): %s", row)
		case !strings.HasPrefix(row, "| "+c.name+" | 2 | "), strings.Contains(row, "error"), strings.Contains(row, "**"):
			t.Errorf("dlock row reports a failure: %s", row)
		}
	}
}

// A peer's failure, overlapping terms or missed bound is reported in scenario 12's table without
// failing the run; dlock's fail it.
func TestElectionTable(t *testing.T) {
	cfg := defaultConfig(true)
	cfg.electTTL, cfg.electKills = time.Second, 3
	dl := &electContender{name: "dlock Campaign (rueidis)", kind: kindDlock}
	peer := &electContender{name: "redsync lock-and-retry", kind: kindPeer}
	down := &electContender{name: "redislock lock-and-retry", kind: kindPeer}
	good := electResult{recovery: []time.Duration{900 * time.Millisecond, 800 * time.Millisecond, 1000 * time.Millisecond},
		left: []time.Duration{890 * time.Millisecond, 796 * time.Millisecond, -1}, terms: 4}
	bad := electResult{recovery: []time.Duration{1100 * time.Millisecond, 1400 * time.Millisecond}, left: []time.Duration{900 * time.Millisecond, 1000 * time.Millisecond},
		terms: 3, overlaps: 1, err: errors.New("kill 3: no new leader acted within 15s")}
	cs := []*electContender{dl, peer, down}
	out, ok := electionTable(cfg, cs, map[*electContender]electResult{dl: good, peer: bad, down: {err: errors.New("candidate 0 exited")}})
	t.Log("\n" + out)
	if !ok {
		t.Error("a peer's failures failed the run")
	}
	for _, want := range []string{
		"| dlock Campaign (rueidis) | 3 | 900 ms | 1000 ms | 1000 ms | 0.90 | 843 ms | 7 / 10 ms | 0 of 4 terms |",
		"| redsync lock-and-retry | 2 (then: kill 3: no new leader acted within 15s) | 1250 ms | 1400 ms | 1400 ms | 1.25 | 950 ms | 300 / 400 ms | **1 of 3 terms** |",
		"| redislock lock-and-retry | 0 | error: candidate 0 exited | | | | | | 0 of 0 terms |",
		"met by dlock Campaign (rueidis) (max 1000 ms); not met by redsync lock-and-retry (max 1400 ms), redislock lock-and-retry (no kill measured).",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	for name, r := range map[string]electResult{
		"overlap": {recovery: good.recovery, left: good.left, terms: 4, overlaps: 1},
		"error":   {recovery: good.recovery, left: good.left, terms: 4, err: errors.New("candidate 2 exited")},
	} {
		if _, ok := electionTable(cfg, cs[:1], map[*electContender]electResult{dl: r}); ok {
			t.Errorf("dlock's %s did not fail the run", name)
		}
	}
	if n := termOverlaps([]electTerm{{10, 20}, {30, 40}, {21, 25}}); n != 0 {
		t.Errorf("disjoint terms: %d overlaps", n)
	}
	if n := termOverlaps([]electTerm{{10, 50}, {30, 40}, {45, 60}}); n != 2 {
		t.Errorf("terms inside a long one: %d overlaps, want 2", n)
	}
	for k := range 50 {
		if h := electHold(time.Second, k); h < 200*time.Millisecond || h >= 200*time.Millisecond+time.Second/3 {
			t.Errorf("hold %d: %v outside [TTL/5, TTL/5 + TTL/3)", k, h)
		}
	}
}
