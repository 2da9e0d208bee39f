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

func aggregateHot(rs []s2Result) hotRow {
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
func writeHotTable(b *strings.Builder, locks []*contender, rows map[*contender]hotRow, exclusion func(*contender, hotRow) string) {
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
	if d := rows[contenderByName("dlock (rueidis)")]; d.rate > 0 && bestRate > 0 {
		fmt.Fprintf(b, "\n- dlock (rueidis) = **%s** the best peer (%s) in handoffs/s", ratio(d.rate, bestRate), bestName)
		if bestChanges, name := best(func(r hotRow) float64 { return r.changes }); bestChanges > 0 {
			fmt.Fprintf(b, "; **%s** the best peer (%s) in handoffs to another goroutine", ratio(d.changes, bestChanges), name)
		}
		b.WriteString(".\n")
	}
}
