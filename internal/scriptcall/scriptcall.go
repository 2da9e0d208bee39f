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
func Batch(calls []conn.Call, send func(calls []conn.Call, eval bool) []conn.Result, noScript func(error) bool) []conn.Result {
	out := send(calls, false)
	var again []int
	resent := false // a script was answered NOSCRIPT since the last WAIT
	for i, c := range calls {
		switch {
		case c.Script != nil && out[i].Err != nil && noScript(out[i].Err):
			again = append(again, i)
			resent = true
		case c.Script == nil && resent:
			again = append(again, i)
			resent = false
		}
	}
	if len(again) == 0 {
		return out
	}
	resend := make([]conn.Call, len(again))
	for j, i := range again {
		resend[j] = calls[i]
	}
	for j, r := range send(resend, true) {
		out[again[j]] = r
	}
	return out
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
