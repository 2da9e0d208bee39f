// Package scriptcall holds the rule both adapters follow to run dlock's scripts: by SHA
// (EVALSHA), and again with the full source (EVAL) when the server answers NOSCRIPT, after a
// restart, a failover or SCRIPT FLUSH. In a pipeline that holds WAITs (see conn.Call), a WAIT
// that followed a re-sent script is re-sent after it, so that some WAIT comes after the writes
// the script makes. The adapters supply how to send and how a NOSCRIPT error looks.
package scriptcall

import "github.com/dlock-go/dlock/conn"

// Eval runs one script call with do: by SHA, then, if noScript says the server did not have
// the script, with its source. do sends EVAL when eval is set, else EVALSHA.
func Eval(do func(eval bool) ([]int64, error), noScript func(error) bool) ([]int64, error) {
	v, err := do(false)
	if err != nil && noScript(err) {
		v, err = do(true)
	}
	return v, err
}

// Batch sends calls in one pipeline with send, then the scripts answered NOSCRIPT in a second
// one, with EVAL, each followed again by the WAIT that followed it (once per WAIT, after the
// last re-sent script before it). send sends its calls in order, on one connection when they
// hold a WAIT, scripts as EVAL when eval is set, else as EVALSHA, and returns one result per
// call.
//
// The second pipeline may go on another connection than the first, and a WAIT covers only the
// writes up to its connection's last one. When scripts before a WAIT were answered otherwise
// than NOSCRIPT in the first pipeline (they may have written) and the re-sent ones write
// nothing, the re-sent WAIT covers none of those writes; so such a WAIT reports the fewer
// acknowledgements of its two answers (or an error if either is one). When every script before
// it was re-sent, its first answer covered nothing of the batch and the second one stands.
func Batch(calls []conn.Call, send func(calls []conn.Call, eval bool) []conn.Result, noScript func(error) bool) []conn.Result {
	return BatchOf(calls, func(_ []int, calls []conn.Call, eval bool) []conn.Result { return send(calls, eval) }, noScript)
}

// BatchOf is Batch, with send also told which of calls it sends (their indexes, in order; nil
// when it sends them all), for an adapter that keeps something per call beside it (the context
// of the caller that made it).
func BatchOf(calls []conn.Call, send func(idx []int, calls []conn.Call, eval bool) []conn.Result, noScript func(error) bool) []conn.Result {
	out := send(nil, calls, false)
	var again []int
	var both []bool              // by index in again: a WAIT whose two answers count
	resent, kept := false, false // since the last WAIT: a script answered NOSCRIPT; one answered otherwise
	for i, c := range calls {
		switch {
		case c.Script != nil && out[i].Err != nil && noScript(out[i].Err):
			again = append(again, i)
			both = append(both, false)
			resent = true
		case c.Script != nil:
			kept = true
		case resent:
			again = append(again, i)
			both = append(both, kept)
			resent, kept = false, false
		default:
			kept = false
		}
	}
	if len(again) == 0 {
		return out
	}
	resend := make([]conn.Call, len(again))
	for j, i := range again {
		resend[j] = calls[i]
	}
	for j, r := range send(again, resend, true) {
		i := again[j]
		if both[j] {
			r = fewer(out[i], r)
		}
		out[i] = r
	}
	return out
}

// fewer is what two answers to one WAIT say together: the first error, else the smaller count.
func fewer(a, b conn.Result) conn.Result {
	switch {
	case a.Err != nil:
		return a
	case b.Err != nil:
		return b
	case len(a.Ints) > 0 && len(b.Ints) > 0 && a.Ints[0] < b.Ints[0]:
		return a
	}
	return b
}

// WaitMillis is the timeout in milliseconds of a WAIT for c, never 0 for a positive timeout:
// WAIT n 0 blocks until n replicas acknowledge, however long that takes.
func WaitMillis(c conn.Call) int64 {
	ms := c.WaitTimeout.Milliseconds()
	if ms == 0 && c.WaitTimeout > 0 {
		ms = 1
	}
	return ms
}
