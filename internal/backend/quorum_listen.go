package backend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/conn"
)

// Listen subscribes on every server, so that a release announced by any of them wakes the
// waiters. It succeeds when a majority could be reached; while some server is missing, the
// listener reports itself done after listenRetry so that the client subscribes again,
// including to the servers that came back.
func (q *Quorum) Listen(ctx context.Context, h conn.Handler) (conn.Listener, error) {
	ql := &quorumListener{done: make(chan error, 1), quit: make(chan struct{})}
	type listened struct {
		ln  conn.Listener
		err error
	}
	var errs []error
	for _, l := range inParallel(q.nodes, func(i int, n conn.Conn) listened {
		// Announcements say which server made them (a grant counts per server).
		nh := h
		if h.Message != nil {
			nh.Message = func(channel, payload string) { h.Message(channel, payload+ServerTag+strconv.Itoa(i)) }
		}
		ln, err := n.Listen(ctx, nh)
		return listened{ln, err}
	}) {
		switch {
		case l.err != nil:
			errs = append(errs, l.err)
		case l.ln != nil:
			ql.lns = append(ql.lns, l.ln)
		}
	}
	if len(ql.lns) < q.need {
		ql.closeAll()
		return nil, fmt.Errorf("pub/sub on %d of %d servers: %w", len(ql.lns), len(q.nodes), joinErrors(errs...))
	}
	missing := len(ql.lns) < len(q.nodes)
	ql.wg.Add(1)
	go ql.watch(missing)
	return ql, nil
}

// ServerTag separates an announcement from the index of the server that made it, in quorum
// mode (see listen).
const ServerTag = "\x00"

// ErrListenRetry ends a quorum listener that could not reach every server, after listenRetry,
// so that the client subscribes again, including to the servers that came back: no loss of the
// subscription (a majority was listening all along).
var ErrListenRetry = errors.New("pub/sub: retrying the servers that were unreachable")

// listenRetry is how long a quorum listener that could not reach every server waits before it
// asks to be made again.
const listenRetry = 3 * time.Second

// quorumListener is one conn.Listener over the listeners of the servers it could reach.
type quorumListener struct {
	lns  []conn.Listener
	done chan error
	quit chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func (l *quorumListener) watch(missing bool) {
	defer l.wg.Done()
	cases := make(chan error, len(l.lns))
	stop := make(chan struct{})
	defer close(stop)
	for _, ln := range l.lns {
		go func() {
			select {
			case err := <-ln.Done():
				cases <- err
			case <-stop:
			}
		}()
	}
	var retry <-chan time.Time
	if missing {
		t := time.NewTimer(listenRetry)
		defer t.Stop()
		retry = t.C
	}
	select {
	case err := <-cases:
		if err == nil {
			err = errors.New("pub/sub connection closed")
		}
		l.done <- err
	case <-retry:
		l.done <- ErrListenRetry
	case <-l.quit:
	}
	close(l.done)
}

func (l *quorumListener) Subscribe(ctx context.Context, channels ...string) error {
	return l.each(func(ln conn.Listener) error { return ln.Subscribe(ctx, channels...) })
}

func (l *quorumListener) Unsubscribe(ctx context.Context, channels ...string) error {
	return l.each(func(ln conn.Listener) error { return ln.Unsubscribe(ctx, channels...) })
}

func (l *quorumListener) each(f func(conn.Listener) error) error {
	return joinErrors(inParallel(l.lns, func(_ int, ln conn.Listener) error { return f(ln) })...)
}

func (l *quorumListener) Done() <-chan error { return l.done }

func (l *quorumListener) Close() error {
	l.once.Do(func() {
		close(l.quit)
		l.closeAll()
		l.wg.Wait()
	})
	return nil
}

func (l *quorumListener) closeAll() {
	for _, ln := range l.lns {
		ln.Close()
	}
}
