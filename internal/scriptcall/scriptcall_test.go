package scriptcall

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conn"
)

var errNoScript = errors.New("NOSCRIPT No matching script")

func isNoScript(err error) bool { return errors.Is(err, errNoScript) }

var (
	a = conn.NewScript("a.lua", "return 1")
	b = conn.NewScript("b.lua", "return 2")
)

// server answers pipelines as a server whose script cache holds cached: EVALSHA of another
// script is NOSCRIPT, EVAL caches it. A script's reply is its position in its pipeline; the
// k-th WAIT of all pipelines answers waits[k] (or an error if it is negative).
type server struct {
	cached map[string]bool
	waits  []int64
	sent   []string // each pipeline, as "EVALSHA a.lua k1, WAIT, ..."
}

func (s *server) send(calls []conn.Call, eval bool) []conn.Result {
	out := make([]conn.Result, len(calls))
	var line []string
	for i, c := range calls {
		switch {
		case c.Script == nil:
			line = append(line, "WAIT")
			n := s.waits[0]
			s.waits = s.waits[1:]
			if n < 0 {
				out[i].Err = errors.New("wait failed")
			} else {
				out[i].Ints = []int64{n}
			}
		case eval:
			line = append(line, "EVAL "+c.Script.Name+" "+c.Keys[0])
			s.cached[c.Script.SHA] = true
			out[i].Ints = []int64{int64(i)}
		default:
			line = append(line, "EVALSHA "+c.Script.Name+" "+c.Keys[0])
			if !s.cached[c.Script.SHA] {
				out[i].Err = errNoScript
			} else {
				out[i].Ints = []int64{int64(i)}
			}
		}
	}
	s.sent = append(s.sent, strings.Join(line, ", "))
	return out
}

func call(s *conn.Script, key string) conn.Call {
	return conn.Call{Script: s, Keys: []string{key}}
}

var wait = conn.Call{WaitReplicas: 1, WaitTimeout: time.Second}

func show(res []conn.Result) string {
	var out []string
	for _, r := range res {
		if r.Err != nil {
			out = append(out, r.Err.Error())
		} else {
			out = append(out, fmt.Sprint(r.Ints))
		}
	}
	return strings.Join(out, " ")
}

func TestBatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cached []*conn.Script
		calls  []conn.Call
		waits  []int64
		sent   []string
		want   string
	}{{
		name:   "every script cached: one pipeline",
		cached: []*conn.Script{a, b},
		calls:  []conn.Call{call(a, "k1"), call(b, "k2"), wait},
		waits:  []int64{1},
		sent:   []string{"EVALSHA a.lua k1, EVALSHA b.lua k2, WAIT"},
		want:   "[0] [1] [1]",
	}, {
		name:  "no WAIT: only the missing scripts again",
		calls: []conn.Call{call(a, "k1"), call(a, "k2")},
		sent:  []string{"EVALSHA a.lua k1, EVALSHA a.lua k2", "EVAL a.lua k1, EVAL a.lua k2"},
		want:  "[0] [1]",
	}, {
		// Each WAIT that followed a re-sent script follows it again; a WAIT after scripts
		// that were all answered keeps its first answer and is not sent again.
		name:   "WAITs re-sent after the scripts they cover",
		cached: []*conn.Script{b},
		calls:  []conn.Call{call(a, "k1"), wait, call(b, "k2"), wait, call(a, "k3"), call(a, "k4"), wait},
		waits:  []int64{0, 1, 0, 1, 1},
		sent: []string{
			"EVALSHA a.lua k1, WAIT, EVALSHA b.lua k2, WAIT, EVALSHA a.lua k3, EVALSHA a.lua k4, WAIT",
			"EVAL a.lua k1, WAIT, EVAL a.lua k3, EVAL a.lua k4, WAIT",
		},
		want: "[0] [1] [2] [1] [2] [3] [1]",
	}, {
		// b wrote in the first pipeline; the second may go on another connection, and its
		// WAIT need not cover b's write: the fewer acknowledgements count.
		name:   "a WAIT after a script answered in the first pipeline counts both answers",
		cached: []*conn.Script{b},
		calls:  []conn.Call{call(b, "k1"), call(a, "k2"), wait},
		waits:  []int64{0, 1},
		sent:   []string{"EVALSHA b.lua k1, EVALSHA a.lua k2, WAIT", "EVAL a.lua k2, WAIT"},
		want:   "[0] [0] [0]",
	}, {
		name:   "its first answer's error stands",
		cached: []*conn.Script{b},
		calls:  []conn.Call{call(b, "k1"), call(a, "k2"), wait},
		waits:  []int64{-1, 1},
		want:   "[0] [0] wait failed",
	}, {
		name:   "so does its second answer's",
		cached: []*conn.Script{b},
		calls:  []conn.Call{call(b, "k1"), call(a, "k2"), wait},
		waits:  []int64{1, -1},
		want:   "[0] [0] wait failed",
	}, {
		name:   "and the fewer count when it is the second",
		cached: []*conn.Script{b},
		calls:  []conn.Call{call(b, "k1"), call(a, "k2"), wait},
		waits:  []int64{2, 1},
		want:   "[0] [0] [1]",
	}, {
		name:   "an earlier WAIT's segment does not make a later WAIT count both answers",
		cached: []*conn.Script{b},
		calls:  []conn.Call{call(b, "k1"), wait, call(a, "k2"), wait},
		waits:  []int64{1, 0, 1},
		want:   "[0] [1] [0] [1]",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &server{cached: make(map[string]bool), waits: tc.waits}
			for _, sc := range tc.cached {
				s.cached[sc.SHA] = true
			}
			got := Batch(tc.calls, s.send, isNoScript)
			if show(got) != tc.want {
				t.Errorf("results %s, want %s", show(got), tc.want)
			}
			if tc.sent != nil && !slices.Equal(s.sent, tc.sent) {
				t.Errorf("sent\n%s\nwant\n%s", strings.Join(s.sent, "\n"), strings.Join(tc.sent, "\n"))
			}
			if len(s.waits) != 0 {
				t.Errorf("%d WAIT answers unused", len(s.waits))
			}
		})
	}
}

func TestEval(t *testing.T) {
	var sent []bool
	do := func(errs ...error) func(eval bool) ([]int64, error) {
		return func(eval bool) ([]int64, error) {
			sent = append(sent, eval)
			err := errs[0]
			errs = errs[1:]
			if err != nil {
				return nil, err
			}
			return []int64{7}, nil
		}
	}
	other := errors.New("ERR something else")
	for _, tc := range []struct {
		name string
		errs []error
		sent []bool
		err  error
	}{
		{"cached", []error{nil}, []bool{false}, nil},
		{"NOSCRIPT: EVAL", []error{errNoScript, nil}, []bool{false, true}, nil},
		{"another error: not sent again", []error{other}, []bool{false}, other},
		{"EVAL's error", []error{errNoScript, other}, []bool{false, true}, other},
	} {
		sent = nil
		v, err := Eval(do(tc.errs...), isNoScript)
		if !errors.Is(err, tc.err) || (err == nil && !slices.Equal(v, []int64{7})) || !slices.Equal(sent, tc.sent) {
			t.Errorf("%s: %v, %v; sent (eval) %v, want %v", tc.name, v, err, sent, tc.sent)
		}
	}
}

func TestWaitMillis(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, time.Microsecond: 1, 1500 * time.Microsecond: 1, 2 * time.Second: 2000} {
		if got := WaitMillis(conn.Call{WaitTimeout: d}); got != want {
			t.Errorf("WaitMillis(%v) = %d, want %d", d, got, want)
		}
	}
}
