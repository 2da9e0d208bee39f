package dlock

import (
	"context"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/backend"
	"github.com/dlock-go/dlock/rueidisconn"
)

// DialQuorum connects to N independent Redis masters (not replicas of each other) and returns
// a Client whose locks are Redlock quorum locks over them: an acquisition is fanned out to
// every server in parallel and succeeds when a majority granted it while its lease still had
// time left (validity = TTL − time the acquisition took − drift; see WithTTL); on failure the
// lock is released everywhere. Renewal and release go to every server; the lease context is
// cancelled (cause ErrLost) when a majority can no longer be renewed in time. The Mutex,
// Lease and Do API, re-entry and wake-up on release (from any server) work as with Dial.
//
// A majority of urls must be reachable now; the others are dialled again, at most once a
// second, when a call needs them. Use an odd number of servers, typically 5: fewer than 3, or
// one address given twice, is ErrInvalid (two spellings of one server, such as localhost and
// 127.0.0.1, are not told apart). A ctx already done fails at once. The fencing
// token guarantee in quorum mode is weaker than on one server: see the package documentation.
func DialQuorum(ctx context.Context, urls []string, opts ...ClientOption) (*Client, error) {
	o := defaultOptions().withClient(opts)
	if o.err != nil {
		return nil, o.err
	}
	if len(urls) < minQuorum {
		return nil, fmt.Errorf("%w: DialQuorum needs at least %d servers, got %d (use Dial for one)", ErrInvalid, minQuorum, len(urls))
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dlock: dial quorum: %w", err)
	}
	seen := make(map[string]bool)
	for i, u := range urls {
		if err := noURL(fmt.Sprintf("DialQuorum: server %d of %d", i+1, len(urls)), u); err != nil {
			return nil, err
		}
		a := rueidisconn.NewRedialing(u).Addr()
		if seen[a] {
			return nil, fmt.Errorf("%w: DialQuorum: server %s given twice: a quorum needs independent servers", ErrInvalid, a)
		}
		seen[a] = true
	}
	nodes := make([]*rueidisconn.Redialing, len(urls))
	errs := make([]error, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		nodes[i] = rueidisconn.NewRedialing(u, o.dialOptions()...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = nodes[i].Dial(ctx)
			if errs[i] != nil && speaksOtherProtocol(errs[i]) {
				errs[i] = newNotRedis(nodes[i].Addr(), errs[i])
			}
		}()
	}
	wg.Wait()
	closeAll := func() {
		for _, n := range nodes {
			n.Close()
		}
	}
	up := 0
	for _, err := range errs {
		if err == nil {
			up++
		}
	}
	if need := len(urls)/2 + 1; up < need {
		closeAll()
		return nil, fmt.Errorf("dlock: dial quorum: %d of %d servers reachable, a majority needs %d: %w",
			up, len(urls), need, joinErrors(errs...))
	}
	cns := make([]conn.Conn, len(nodes))
	for i, n := range nodes {
		cns[i] = n
	}
	c, err := newQuorumClient(ctx, cns, true, opts)
	if err != nil {
		closeAll()
		return nil, err
	}
	return c, nil
}

// minQuorum is the fewest servers a quorum takes: with two, either one down stops every lock.
const minQuorum = 3

// NewQuorum returns a quorum Client (see DialQuorum) over conns, one per independent Redis
// master, made by the rueidisconn or goredisconn adapters. Close does not close them.
func NewQuorum(conns []Conn, opts ...ClientOption) (*Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), newCheckTimeout)
	defer cancel()
	return newQuorumClient(ctx, conns, false, opts)
}

func newQuorumClient(ctx context.Context, conns []Conn, own bool, opts []ClientOption) (*Client, error) {
	if len(conns) < minQuorum {
		return nil, fmt.Errorf("%w: a quorum needs at least %d servers, got %d (use New for one)", ErrInvalid, minQuorum, len(conns))
	}
	seen := make(map[string]bool)
	for i, cn := range conns {
		if cn == nil {
			return nil, fmt.Errorf("%w: connection %d is nil", ErrInvalid, i)
		}
		if a := cn.Addr(); seen[a] {
			return nil, fmt.Errorf("%w: server %s given twice: a quorum needs independent servers", ErrInvalid, a)
		} else {
			seen[a] = true
		}
	}
	o := defaultOptions().withClient(opts)
	if o.err != nil {
		return nil, o.err
	}
	if !own {
		if err := o.noTLS("NewQuorum"); err != nil {
			return nil, err
		}
	}
	if o.ackN > 0 {
		return nil, fmt.Errorf("%w: WithReplicaAck is not available in quorum mode", ErrInvalid)
	}
	q := backend.NewQuorum(conns, o.retention)
	q.Own = own
	c, err := newClient(ctx, q, o)
	if err != nil {
		q.Halt()
		return nil, err
	}
	return c, nil
}
