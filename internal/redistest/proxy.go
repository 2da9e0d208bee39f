package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	proxyDialTimeout = 5 * time.Second
	proxyChunkSize   = 32 << 10
	// proxyQueueLen chunks may be read ahead of the writer per direction;
	// beyond that, TCP flow control holds the sender.
	proxyQueueLen = 64
)

// Proxy is a TCP proxy on a free loopback port in front of Target, for fault
// injection. Each direction of each connection is forwarded in order by one
// reader and one writer goroutine; Close stops them all.
type Proxy struct {
	Addr   string // "127.0.0.1:PORT" to connect to instead of Target
	Target string

	ln     net.Listener
	ctx    context.Context // cancelled by Close; aborts pending dials
	cancel context.CancelFunc
	delay  atomic.Int64 // time.Duration added to every chunk
	jitter atomic.Int64 // time.Duration: each chunk's delay varies by up to ± this
	reply  atomic.Int64 // time.Duration added to every chunk from Target to the client
	wg     sync.WaitGroup

	mu     sync.Mutex
	gate   chan struct{} // non-nil while blocked; closed by Unblock
	conns  map[*proxyConn]struct{}
	closed bool
}

// proxyConn is one client connection and its connection to Target.
type proxyConn struct {
	client, server net.Conn
	done           chan struct{} // closed when the pair is torn down
	once           sync.Once
}

// close tears the pair down; abort resets the client side (RST) instead of
// closing it gracefully. Safe to call more than once.
func (pc *proxyConn) close(abort bool) {
	pc.once.Do(func() {
		close(pc.done)
		if tc, ok := pc.client.(*net.TCPConn); ok && abort {
			_ = tc.SetLinger(0)
		}
		_ = pc.client.Close()
		_ = pc.server.Close()
	})
}

// NewProxy starts a proxy like StartProxy and registers tb.Cleanup to close
// it; it calls tb.Fatalf on failure.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := StartProxy(target)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
		return nil
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("redistest: close proxy %s: %v", p.Addr, err)
		}
	})
	return p
}

// StartProxy listens on a free 127.0.0.1 port and forwards every accepted
// connection to target. The caller must call Close.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("redistest: proxy listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		Addr:   ln.Addr().String(),
		Target: target,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		conns:  make(map[*proxyConn]struct{}),
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// URL returns "redis://" + Addr + "/0".
func (p *Proxy) URL() string { return "redis://" + p.Addr + "/0" }

// Block partitions the proxy: from now on no byte is forwarded in either
// direction, on existing and new connections (new ones are still accepted).
// Bytes are held, not dropped, and are delivered after Unblock.
func (p *Proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
}

// Unblock ends a Block; held bytes are then delivered in order.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

// CutAll closes every current connection immediately: clients see a reset,
// the target sees a close, and held bytes are dropped. Connections accepted
// afterwards are forwarded as usual.
func (p *Proxy) CutAll() {
	for _, pc := range p.snapshot() {
		pc.close(true)
	}
}

// SetDelay delays every forwarded chunk, in each direction, by d after it
// was read (0 or less: no delay). Byte order is preserved.
func (p *Proxy) SetDelay(d time.Duration) {
	p.delay.Store(int64(max(d, 0)))
}

// SetReplyDelay delays every chunk from Target to the client by d more (0 or less:
// none), in addition to SetDelay's: requests arrive at once, their replies late. A
// chunk's delay is fixed when its turn to be written comes, so a reply already
// waiting keeps the delay it got.
func (p *Proxy) SetReplyDelay(d time.Duration) {
	p.reply.Store(int64(max(d, 0)))
}

// SetJitter makes the delay of SetDelay vary per chunk, uniformly within ± j
// (never below zero): SetDelay(50ms) with SetJitter(25ms) gives 25–75 ms.
// Byte order is still preserved: a chunk never overtakes an earlier one, so a
// short delay drawn after a long one waits for it. 0 or less: no jitter.
func (p *Proxy) SetJitter(j time.Duration) {
	p.jitter.Store(int64(max(j, 0)))
}

// chunkDelay returns the delay for one chunk: the SetDelay value plus a
// uniform draw within ± the SetJitter value, at least zero.
func (p *Proxy) chunkDelay() time.Duration {
	d := time.Duration(p.delay.Load())
	if d <= 0 {
		return 0
	}
	if j := p.jitter.Load(); j > 0 {
		d += time.Duration(rand.Int64N(2*j+1) - j)
	}
	return max(d, 0)
}

// NumConns returns the number of connections currently being forwarded.
func (p *Proxy) NumConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening, closes all connections and returns once every
// goroutine of the proxy has exited. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	p.mu.Unlock()

	p.cancel()
	err := p.ln.Close()
	// No connection can be added after closed was set (see track).
	for _, pc := range p.snapshot() {
		pc.close(false)
	}
	p.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("redistest: close proxy: %w", err)
	}
	return nil
}

func (p *Proxy) snapshot() []*proxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	return conns
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient failure such as EMFILE: back off briefly.
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-p.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *Proxy) handle(client net.Conn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: proxyDialTimeout}
	server, err := d.DialContext(p.ctx, "tcp", p.Target)
	if err != nil {
		// Target unreachable: the client sees its connection reset.
		if tc, ok := client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = client.Close()
		return
	}
	pc := &proxyConn{client: client, server: server, done: make(chan struct{})}
	if !p.track(pc) {
		pc.close(false)
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.forward(pc, client, server, false)
	}()
	p.forward(pc, server, client, true)
	<-pc.done
	p.untrack(pc)
}

// track registers pc unless the proxy is closed.
func (p *Proxy) track(pc *proxyConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[pc] = struct{}{}
	return true
}

func (p *Proxy) untrack(pc *proxyConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, pc)
}

type chunk struct {
	data   []byte
	readAt time.Time
}

// forward copies src to dst until either fails or pc is torn down, then tears
// pc down. A reader goroutine timestamps chunks; this goroutine writes them
// in order once their delay has passed and the proxy is not blocked.
func (p *Proxy) forward(pc *proxyConn, src, dst net.Conn, toClient bool) {
	defer pc.close(false)
	queue := make(chan chunk, proxyQueueLen)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(queue)
		for {
			buf := make([]byte, proxyChunkSize)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case queue <- chunk{data: buf[:n], readAt: time.Now()}:
				case <-pc.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	// After src ends, the queued bytes are still delivered before the pair
	// is closed.
	for c := range queue {
		d := p.chunkDelay()
		if toClient {
			d += time.Duration(p.reply.Load())
		}
		if d > 0 {
			if !sleepUntil(c.readAt.Add(d), pc.done) {
				return
			}
		}
		if !p.waitUnblocked(pc.done) {
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			return
		}
	}
}

// waitUnblocked waits while the proxy is blocked; false means done closed.
func (p *Proxy) waitUnblocked(done <-chan struct{}) bool {
	for {
		p.mu.Lock()
		gate := p.gate
		p.mu.Unlock()
		if gate == nil {
			return true
		}
		select {
		case <-gate:
			// Re-check: Block may have been called again.
		case <-done:
			return false
		}
	}
}

// sleepUntil waits until t; false means done closed first.
func sleepUntil(t time.Time, done <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-done:
		return false
	}
}
