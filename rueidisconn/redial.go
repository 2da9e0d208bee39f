package rueidisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/redact"
)

// Redialing is a Conn to one server that keeps trying to connect: it is dialled once by Dial
// and, when that failed, again when a call needs it, at most once per RedialEvery. Meanwhile
// calls fail at once with the last dial error. dlock.DialQuorum makes one per server, so that
// a server down at the start joins the quorum when it comes back. Its Addr never holds a
// password.
type Redialing struct {
	url  string
	opts []DialOption
	addr string

	mu       sync.Mutex
	cn       conn.Conn
	lastTry  time.Time
	lastErr  error
	closed   bool
	inFlight bool
}

var _ conn.Conn = (*Redialing)(nil)

// RedialEvery is the least time between two dials of a Redialing.
const RedialEvery = time.Second

// NewRedialing returns a Redialing for url (any form Dial takes), not yet connected.
func NewRedialing(url string, opts ...DialOption) *Redialing {
	r := &Redialing{url: url, opts: opts}
	if opt, err := ParseURL(url); err == nil {
		r.addr = strings.Join(opt.InitAddress, ",")
	} else {
		r.addr = redact.URL(url)
	}
	return r
}

// Dial connects now, and returns why it could not.
func (r *Redialing) Dial(ctx context.Context) error {
	cn, err := Dial(ctx, r.url, r.opts...)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastTry, r.lastErr = time.Now(), err
	if err != nil {
		return err
	}
	if r.closed {
		cn.Close()
		return errors.New("closed")
	}
	r.cn = cn
	return nil
}

// get returns the connection, dialling again when it is time to.
func (r *Redialing) get(ctx context.Context) (conn.Conn, error) {
	r.mu.Lock()
	if r.cn != nil || r.closed {
		cn := r.cn
		r.mu.Unlock()
		if cn == nil {
			return nil, errors.New("closed")
		}
		return cn, nil
	}
	if r.inFlight || time.Since(r.lastTry) < RedialEvery {
		err := r.lastErr
		r.mu.Unlock()
		return nil, fmt.Errorf("server %s unreachable: %w", r.addr, err)
	}
	r.inFlight = true
	r.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	err := r.Dial(dctx)
	cancel()
	r.mu.Lock()
	r.inFlight = false
	cn := r.cn
	r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("server %s unreachable: %w", r.addr, err)
	}
	return cn, nil
}

// Addr is the server's host:port, without user or password.
func (r *Redialing) Addr() string { return r.addr }

func (r *Redialing) Eval(ctx context.Context, s *conn.Script, keys, args []string) ([]int64, error) {
	cn, err := r.get(ctx)
	if err != nil {
		return nil, err
	}
	return cn.Eval(ctx, s, keys, args)
}

func (r *Redialing) EvalMulti(ctx context.Context, calls []conn.Call) []conn.Result {
	cn, err := r.get(ctx)
	if err != nil {
		out := make([]conn.Result, len(calls))
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	return cn.EvalMulti(ctx, calls)
}

func (r *Redialing) Command(ctx context.Context, args ...string) (any, error) {
	cn, err := r.get(ctx)
	if err != nil {
		return nil, err
	}
	return cn.Command(ctx, args...)
}

func (r *Redialing) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	cn, err := r.get(ctx)
	if err != nil {
		return nil, err
	}
	return cn.Listen(ctx, h)
}

// Close closes the connection, if any; later calls fail.
func (r *Redialing) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.cn != nil {
		err := r.cn.Close()
		r.cn = nil
		return err
	}
	return nil
}
