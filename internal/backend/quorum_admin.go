package backend

import (
	"context"
	"sync"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Ping sends PING to every server and returns nil as soon as a majority answered, the
// servers a lock needs. Otherwise it waits for every answer (within ctx: a server that does
// not answer in time fails with ctx's error) and returns a *QuorumError that says what each
// server did ("answered" or "error"). Each server's error goes to q.OnNodeError.
func (q *Quorum) Ping(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	type answer struct {
		node int
		err  error
	}
	answers := make(chan answer, len(q.nodes))
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := n.Command(ctx, "PING")
			answers <- answer{i, err}
		}()
	}
	states := make([]errs.ServerState, len(q.nodes))
	ok := 0
	for range q.nodes {
		a := <-answers
		states[a.node] = errs.ServerState{Addr: q.nodes[a.node].Addr(), State: "answered"}
		if a.err != nil {
			states[a.node].State, states[a.node].Err = "error", a.err
			if q.OnNodeError != nil {
				q.OnNodeError(states[a.node].Addr, "PING", a.err)
			}
			continue
		}
		if ok++; ok >= q.need {
			return nil
		}
	}
	return q.noQuorum("ping", states, 0)
}

// Probe runs on every server; the first that denies something (or, when none does, no server)
// is reported. Servers that cannot be reached are left to the acquisitions to report.
func (q *Quorum) Probe(ctx context.Context, keys []string, channel string) ([]string, string, error) {
	type ans struct {
		denied []string
		err    error
	}
	res := inParallel(q.nodes, func(_ int, n conn.Conn) ans {
		reply, err := evalStrings(ctx, n, protocol.ScriptProbe, keys, channel, "p")
		return ans{probeDenied(reply), err}
	})
	for i, r := range res {
		if len(r.denied) > 0 || (r.err != nil && errs.Classify(r.err) == errs.ErrDenied) {
			return r.denied, q.nodes[i].Addr(), r.err
		}
	}
	return nil, "", nil
}

// first runs f on every server in parallel and returns the answer of the first server, in the
// order given, that answered without an error (inspection reads that server's view).
func (q *Quorum) first(ctx context.Context, f func(context.Context, conn.Conn) (any, error)) (any, error) {
	type ans struct {
		v   any
		err error
	}
	res := inParallel(q.nodes, func(_ int, n conn.Conn) ans {
		v, err := f(ctx, n)
		return ans{v, err}
	})
	for _, r := range res {
		if r.err == nil {
			return r.v, nil
		}
	}
	return nil, res[0].err
}

func (q *Quorum) Inspect(ctx context.Context, keys []string) (any, error) {
	return q.first(ctx, func(ctx context.Context, cn conn.Conn) (any, error) {
		return evalStrings(ctx, cn, protocol.ScriptInspect, inspectKeys(keys))
	})
}

// ForceUnlock releases on every server; the reply is the first server's (in order) that
// answered.
func (q *Quorum) ForceUnlock(ctx context.Context, key, channel string) (any, error) {
	return q.first(ctx, func(ctx context.Context, cn conn.Conn) (any, error) {
		qk, wk := protocol.QueueKeys(key)
		return evalStrings(ctx, cn, protocol.ScriptForceUnlock, []string{key, qk, wk}, q.retention, channel)
	})
}

// Scan walks the first reachable server only, so that its cursor stays on one server.
func (q *Quorum) Scan(ctx context.Context, cursor, pattern string) (any, error) {
	var errs []error
	for _, n := range q.nodes {
		v, err := n.Command(ctx, "SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
		if err == nil {
			return v, nil
		}
		errs = append(errs, err)
	}
	return nil, joinErrors(errs...)
}

// Masters asks every server.
func (q *Quorum) Masters(ctx context.Context, args ...string) []conn.MasterReply {
	return inParallel(q.nodes, func(_ int, n conn.Conn) conn.MasterReply {
		v, err := n.Command(ctx, args...)
		return conn.MasterReply{Addr: n.Addr(), Reply: v, Err: err}
	})
}
