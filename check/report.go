package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

const (
	docsStart = "<!-- check:start -->"
	docsEnd   = "<!-- check:end -->"
)

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1f", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f", float64(d)/1e6)
}

// markdownTable is the per-run table: one row per scenario and mode.
func markdownTable(all []*findings) string {
	var b strings.Builder
	b.WriteString("| scenario | mode | ops | acquisitions | local handoffs | faults | overlaps | lost updates | stale refused / landed | acquire p50 / p99 (ms) | recovery median / max (ms) | lost-lock signals: before the next grant (least margin, ms) / later, never acted on / later, acted on | context said held after re-acquire | terms believed at once (elections) | linearizable | memory pressure | verdict |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|---|\n")
	for _, f := range all {
		rec := "–"
		if len(f.Recovery) > 0 {
			r := slices.Clone(f.Recovery)
			slices.Sort(r)
			rec = ms(r[(len(r)-1)/2]) + " / " + ms(r[len(r)-1])
		}
		verdict := "ok"
		if len(f.Failures) > 0 {
			verdict = fmt.Sprintf("**FAIL** (%d)", len(f.Failures))
		}
		live := fmt.Sprint(f.LiveAfterNext)
		if f.UnsureLive > 0 {
			live += fmt.Sprintf(" (+%d during)", f.UnsureLive)
		}
		margin := ""
		if len(f.SignalMargins) > 0 {
			margin = " (" + ms(slices.Min(f.SignalMargins)) + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %s | %s | %d | %d | %d / %d | %s / %s | %s | %d: %d%s / %d / %d | %s | %s | %s | %s | %s |\n",
			f.Scenario, f.Mode, f.Ops, f.Cycles, handoffsCell(f), faultsCell(f), f.Overlaps, f.LostUpdates, f.StaleRejected, f.StaleLanded,
			ms(f.AcquireP50), ms(f.AcquireP99), rec, f.Signals, f.SignalsBefore, margin, f.SignalsLate, f.SignalsAfter,
			live, leadersCell(f), f.Linearizable, memoryCell(f), verdict)
	}
	return b.String()
}

// handoffsCell is the report's count of local handoffs; a turn row's says how many of them were
// a goroutine taking back the lock its own Unlock had parked.
func handoffsCell(f *findings) string {
	if s, ok := scenarioNamed(f.Scenario); ok && s.turnSlice > 0 {
		return fmt.Sprintf("%d (%d taken back by the unlocking goroutine)", f.LocalHandoffs, f.TakenBack)
	}
	return fmt.Sprint(f.LocalHandoffs)
}

// faultsCell is the report's count of a run's faults; a turn row's says how many came between
// holds and found the lock parked (with the longest wait of the others after one), held by a
// sibling, or released (turns.go).
func faultsCell(f *findings) string {
	s, ok := scenarioNamed(f.Scenario)
	if !ok || s.turnSlice == 0 {
		return fmt.Sprint(f.Faults)
	}
	wait := ""
	if f.TurnParked > 0 {
		wait = ", others waited ≤ " + ms(f.TurnParkedWaitMax) + " ms"
	}
	return fmt.Sprintf("%d (between holds: %d parked%s, %d held, %d released)", f.Faults, f.TurnParked, wait, f.TurnHeld, f.TurnReleased)
}

// leadersCell is the report's count of an election row's terms believed at once (election.go):
// "hazard" where the row's deployment can lose the leader's lease, so that they are counted and
// not failed; "–" for the other rows.
func leadersCell(f *findings) string {
	s, ok := scenarioNamed(f.Scenario)
	if !ok || !s.election {
		return "–"
	}
	c := fmt.Sprint(f.LeaderOverlaps)
	if f.LeaderOverlapsUnsure > 0 {
		c += fmt.Sprintf(" (+%d during)", f.LeaderOverlapsUnsure)
	}
	if s.forgetsLocks {
		c += " (hazard)"
	}
	return c
}

// electionLine is the log line of an election row's run: its terms, the terms believed at
// once, and how soon another process led after each fault that deposed the leader.
func electionLine(f *findings) string {
	line := fmt.Sprintf("election: %d terms; terms believed at once: %s", f.Cycles, leadersCell(f))
	if len(f.NewLeader) > 0 {
		r := slices.Clone(f.NewLeader)
		slices.Sort(r)
		line += fmt.Sprintf("; another process led %s / %s ms (median / max) after each of %d faults", ms(r[(len(r)-1)/2]), ms(r[len(r)-1]), len(r))
	}
	return line
}

// memoryCell is the report's memory-pressure figures of a run: what its scenario's row
// measures (a refused Dial, evictions, or the server out of memory), else "–".
func memoryCell(f *findings) string {
	s, ok := scenarioNamed(f.Scenario)
	switch {
	case !ok:
		return "–"
	case s.dialRefused != "":
		return fmt.Sprintf("%d of %d Dials refused with %s; evicted %d keys", f.DialsRefused, f.Dials, errName(s.dialRefused), f.EvictedKeys)
	case s.memory.filler:
		return fmt.Sprintf("evicted %d keys, the lock's %d times (%d under a holder); %d warnings", f.EvictedKeys, f.LockEvictions, f.LockEvictionsHeld, f.Warnings)
	case s.outOfMemory:
		return fmt.Sprintf("OOM: %d acquisitions refused (ErrOutOfMemory), %d granted (%d by a release); %d Unlocks ok, then released %d / passed on %d / taken again %d",
			f.OOMRefused, f.OOMGrants, f.OOMGrantsOnRelease, f.OOMReleases, f.OOMReleased, f.OOMPassedOn, f.OOMTakenAgain)
	}
	return "–"
}

// participants says how many worker processes and goroutines ran.
func participants(o options) string {
	if o.goroutines == 1 {
		return fmt.Sprintf("%d worker processes, one goroutine each", o.workers)
	}
	return fmt.Sprintf("%d worker processes × %d goroutines sharing each process's one dlock.Client (%d clients of the lock; the lock passes between goroutines of one process by local handoffs)",
		o.workers, o.goroutines, o.workers*o.goroutines)
}

// setupLine heads the printed report.
func setupLine(o options) string {
	return fmt.Sprintf("Seed %d; %s; lease TTL %v (Sentinel scenarios: %v; waiter-faults and frozen-waiters: %v).", o.seed, participants(o), o.ttl, o.sentTTL, o.waiterTTL)
}

type machine struct {
	cpu, kernel, redis, goVersion string
	cores                         int
	load                          string
}

func describeMachine() machine {
	m := machine{cores: runtime.NumCPU(), goVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.load = strings.Join(f[:3], " ")
		}
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		m.redis = strings.TrimSpace(string(out))
	}
	return m
}

// docsSection is what the full run writes between the markers of docs/CORRECTNESS.md.
func docsSection(cmdline string, o options, m machine, elapsed time.Duration, all []*findings, table string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", docsStart)
	fmt.Fprintf(&b, "_Written by `%s` on %s; %d runs in %v._\n\n", cmdline, time.Now().UTC().Format("2006-01-02 15:04 MST"), len(all), elapsed.Round(time.Second))
	fmt.Fprintf(&b, "- Seed %d; %s; lease TTL %v (Sentinel scenarios: %v; waiter-faults and frozen-waiters: %v); each run until %d writes were applied (%d register operations) and %d faults (Sentinel: %d failovers) had played out, or %v passed (Redlock: %v).\n",
		o.seed, participants(o), o.ttl, o.sentTTL, o.waiterTTL, o.cycles, 2*o.cycles, o.minFaults, o.sentFaults, o.maxRun, o.quorumMax)
	fmt.Fprintf(&b, "- Machine: %d cores (%s), Linux %s, %s, %s; load average %s when the run began. The CPU was shared with other work during the run.\n\n",
		m.cores, m.cpu, m.kernel, m.redis, m.goVersion, m.load)
	b.WriteString(table)
	b.WriteString("\n")
	var fails []string
	for _, f := range all {
		for _, msg := range f.Failures {
			fails = append(fails, fmt.Sprintf("- %s %s (seed %d): %s", f.Scenario, f.Mode, f.Seed, msg))
		}
	}
	if len(fails) == 0 {
		b.WriteString("Every claimed guarantee held in every run.\n")
	} else {
		b.WriteString("Guarantees broken in this run:\n\n")
		b.WriteString(strings.Join(fails, "\n"))
		b.WriteString("\n")
	}
	if len(notRun) > 0 {
		b.WriteString("\nNot run (never faked; they need code that is not in the library yet):\n\n")
		for _, s := range notRun {
			fmt.Fprintf(&b, "- %s: %s\n", s.name, s.why)
		}
	}
	fmt.Fprintf(&b, "%s\n", docsEnd)
	return b.String()
}

// writeDocs replaces the text between the markers (inclusive) in path, or appends it.
func writeDocs(path, section string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i := bytes.Index(old, []byte(docsStart))
	j := bytes.Index(old, []byte(docsEnd))
	var out []byte
	if i >= 0 && j > i {
		out = append(out, old[:i]...)
		out = append(out, section...)
		rest := old[j+len(docsEnd):]
		rest = bytes.TrimPrefix(rest, []byte("\n"))
		out = append(out, rest...)
	} else {
		out = append(append(old, '\n'), section...)
	}
	return os.WriteFile(path, out, 0o644)
}
