package main

import (
	"fmt"
	"strings"
)

// hotRow is one contender's line in the hot-name tables (scenarios 2 and 3): medians over the
// repetitions that measured something, and the sums of what broke.
type hotRow struct {
	rate, changes, p50, p99, jain, minShare float64
	n                                       int // repetitions with handoffs
	lost, overlaps                          int64
	err                                     error // last error of a repetition
}

func aggregateHot(rs []hotResult) hotRow {
	var rates, changes, p50, p99, jains, shares []float64
	var r hotRow
	for _, x := range rs {
		r.lost += x.lostUpdates
		r.overlaps += x.overlaps
		if x.err != nil {
			r.err = x.err
		}
		if x.handoffs == 0 {
			continue
		}
		rates = append(rates, x.rate())
		changes = append(changes, float64(x.changes)/x.elapsed.Seconds())
		p50 = append(p50, ms(x.waitP50))
		p99 = append(p99, ms(x.waitP99))
		jains = append(jains, x.jain)
		shares = append(shares, x.minShare)
	}
	r.n = len(rates)
	if r.n > 0 {
		r.rate, r.changes, r.p50, r.p99, r.jain, r.minShare = median(rates), median(changes), median(p50), median(p99), median(jains), median(shares)
	}
	return r
}

// writeHotTable writes the table of a hot-name scenario and dlock's ratios to the best peer;
// exclusion gives each row's mutual-exclusion cell.
// With fig, it records dlock's performance targets beside its peers under scenario sc (g
// goroutines in all).
func writeHotTable(b *strings.Builder, locks []*contender, rows map[*contender]hotRow, exclusion func(*contender, hotRow) string, fig *figures, sc string, g int) {
	best := func(of func(hotRow) float64) (float64, string) {
		var v float64
		var name string
		for _, c := range locks {
			if x := of(rows[c]); c.kind == kindPeer && x > v {
				v, name = x, c.name
			}
		}
		return v, name
	}
	bestRate, bestName := best(func(r hotRow) float64 { return r.rate })
	b.WriteString("| contender | handoffs/s (median) | × best peer | to another goroutine /s | wait p50 | wait p99 | Jain | least served | mutual exclusion |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, c := range locks {
		r := rows[c]
		mx := exclusion(c, r)
		if r.n == 0 {
			fmt.Fprintf(b, "| %s | error: %s | | | | | | | %s |\n", c.name, oneLine(r.err), mx)
			continue
		}
		if r.err != nil {
			mx += " (error in a repetition: " + oneLine(r.err) + ")"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %.2f ms | %.2f ms | %.3f | %.2f | %s |\n", c.name, thousands(r.rate),
			ratio(r.rate, bestRate), thousands(r.changes), r.p50, r.p99, r.jain, r.minShare, mx)
	}
	if d := rows[contenderByName("dlock (rueidis)")]; fig != nil && d.rate > 0 {
		if bestRate > 0 {
			fig.target(sc, "handoffs/s ≥ 2× the best peer", d.rate >= 2*bestRate, "%s (%s)", ratio(d.rate, bestRate), bestName)
		}
		if bestChanges, name := best(func(r hotRow) float64 { return r.changes }); bestChanges > 0 {
			fig.info(sc, "handoffs to another goroutine /s vs the best peer", "%s (%s)", ratio(d.changes, bestChanges), name)
		}
		fig.target(sc, "Jain fairness ≥ 0.9", d.jain >= 0.9, "%.3f (peers: %s)", d.jain, peerJains(locks, rows))
		// Fair share: with g goroutines taking turns at rate handoffs/s, each waits g/rate.
		fair := float64(g) / d.rate * 1000
		fig.target(sc, "wait p99 ≤ 3× the fair-share wait", d.p99 <= 3*fair, "%.1f ms vs 3 × %.1f ms (%d goroutines / handoffs/s)", d.p99, fair, g)
	}
	if d := rows[contenderByName("dlock (rueidis)")]; d.rate > 0 && bestRate > 0 {
		fmt.Fprintf(b, "\n- dlock (rueidis) = **%s** the best peer (%s) in handoffs/s", ratio(d.rate, bestRate), bestName)
		if bestChanges, name := best(func(r hotRow) float64 { return r.changes }); bestChanges > 0 {
			fmt.Fprintf(b, "; **%s** the best peer (%s) in handoffs to another goroutine", ratio(d.changes, bestChanges), name)
		}
		b.WriteString(".\n")
	}
}

func peerJains(locks []*contender, rows map[*contender]hotRow) string {
	var parts []string
	for _, c := range locks {
		if r := rows[c]; c.kind == kindPeer && r.n > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", c.name, r.jain))
		}
	}
	return strings.Join(parts, ", ")
}
