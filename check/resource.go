package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The resource server is the thing the lock protects: one integer register on loopback.
// Workers' goroutines read it and write it back incremented, each request carrying the fencing
// token of the lease it holds. Every operation is stamped with CLOCK_MONOTONIC at the moment it is
// applied, under one mutex, so the server's record is the resource's own timeline.
//
// Wire format, one line each way:
//
//	R <slot> <inc> <g> <seq> <token>\n          read
//	W <slot> <inc> <g> <seq> <token> <value>\n  write value
//	ok <value> <work-ms>\n | stale <value> 0\n
//
// In fenced mode a read or a write whose token is lower than the highest token seen so far is
// refused ("stale") and has no effect; fencing the read as well as the write keeps an old
// holder's late write from landing between a newer holder's read and write. In unfenced mode
// everything is applied and the record only notes which operations a fence would have
// refused. <work-ms> tells the worker how long to "work" between its read and its write: the
// fault schedule uses it to keep a holder inside its critical section while a fault plays out.

// opRecord is one operation as the resource saw it.
type opRecord struct {
	T        int64  `json:"t"` // CLOCK_MONOTONIC ns when applied (or refused)
	Op       byte   `json:"op"`
	Slot     int    `json:"slot"`
	Inc      int    `json:"inc"` // worker incarnation within the slot (a killed worker is respawned)
	G        int    `json:"g"`   // the goroutine within the worker process
	Seq      int64  `json:"seq"` // the goroutine's cycle number: a cycle's read and write share it
	Token    uint64 `json:"token"`
	Value    int64  `json:"value"`    // value read, or value written
	Accepted bool   `json:"accepted"` // applied (always true unfenced)
	Stale    bool   `json:"stale"`    // token below the highest seen: a fence refuses it
}

// trap is a fault that fires on the next matching request: the scheduler arms it, the
// request of whichever worker goroutine holds the lock at that moment springs it.
type trap struct {
	op byte // 'R' or 'W'
	// fire runs in the request's goroutine before the request is applied. It returns the
	// work time to hand back to the worker and whether to drop the request unanswered.
	fire func(w who, token uint64) (work time.Duration, drop bool)
}

func (op opRecord) who() who { return who{op.Slot, op.Inc, op.G} }

type resource struct {
	fenced bool
	ln     net.Listener
	wg     sync.WaitGroup

	mu       sync.Mutex
	value    int64
	maxToken uint64
	log      []opRecord
	trap     *trap
	conns    map[net.Conn]struct{}
	closed   bool
	writes   int // accepted writes
}

func startResource(fenced bool) (*resource, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("resource server: %w", err)
	}
	r := &resource{fenced: fenced, ln: ln, conns: make(map[net.Conn]struct{})}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *resource) Addr() string { return r.ln.Addr().String() }

// arm sets the trap for the next matching request, replacing an unfired one.
func (r *resource) arm(t *trap) {
	r.mu.Lock()
	r.trap = t
	r.mu.Unlock()
}

// disarm removes an unfired trap and reports whether there was one.
func (r *resource) disarm() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	had := r.trap != nil
	r.trap = nil
	return had
}

// acceptedWrites returns how many writes have been applied so far.
func (r *resource) acceptedWrites() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes
}

// snapshot returns the final register value and a copy of the record.
func (r *resource) snapshot() (int64, []opRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.value, append([]opRecord(nil), r.log...)
}

// Close stops the server and returns once every connection goroutine has exited. A request
// held by a trap is released by closing its connection only after the trap returns, so
// callers finish their faults first.
func (r *resource) Close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	r.wg.Wait()
}

func (r *resource) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		r.conns[c] = struct{}{}
		r.mu.Unlock()
		r.wg.Add(1)
		go r.handle(c)
	}
}

func (r *resource) handle(c net.Conn) {
	defer r.wg.Done()
	defer func() {
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		req, err := parseRequest(line)
		if err != nil {
			fmt.Fprintf(c, "error %v\n", err)
			return
		}
		reply, ok := r.do(req)
		if !ok {
			return // dropped by a trap: the worker is gone
		}
		if _, err := c.Write([]byte(reply)); err != nil {
			return
		}
	}
}

type request struct {
	op    byte
	w     who
	seq   int64
	token uint64
	value int64
}

func parseRequest(line string) (request, error) {
	f := strings.Fields(line)
	if len(f) < 6 || (f[0] != "R" && f[0] != "W") || (f[0] == "W") != (len(f) == 7) {
		return request{}, fmt.Errorf("bad request %q", strings.TrimSpace(line))
	}
	var req request
	var errs [6]error
	req.op = f[0][0]
	req.w.Slot, errs[0] = strconv.Atoi(f[1])
	req.w.Inc, errs[1] = strconv.Atoi(f[2])
	req.w.G, errs[2] = strconv.Atoi(f[3])
	req.seq, errs[3] = strconv.ParseInt(f[4], 10, 64)
	req.token, errs[4] = strconv.ParseUint(f[5], 10, 64)
	if req.op == 'W' {
		req.value, errs[5] = strconv.ParseInt(f[6], 10, 64)
	}
	if err := errors.Join(errs[:]...); err != nil {
		return request{}, fmt.Errorf("bad request %q: %w", strings.TrimSpace(line), err)
	}
	return req, nil
}

// do applies one request (after springing a trap that matches it) and returns the reply line;
// ok is false when a trap dropped the request.
func (r *resource) do(req request) (string, bool) {
	r.mu.Lock()
	t := r.trap
	if t != nil && t.op == req.op {
		r.trap = nil
	} else {
		t = nil
	}
	r.mu.Unlock()
	var work time.Duration
	if t != nil {
		var drop bool
		work, drop = t.fire(req.w, req.token)
		if drop {
			return "", false
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	rec := opRecord{T: mono(), Op: req.op, Slot: req.w.Slot, Inc: req.w.Inc, G: req.w.G, Seq: req.seq, Token: req.token}
	rec.Stale = req.token < r.maxToken
	rec.Accepted = !(r.fenced && rec.Stale)
	if rec.Accepted {
		r.maxToken = max(r.maxToken, req.token)
		if req.op == 'W' {
			r.value = req.value
			r.writes++
		}
	}
	if req.op == 'W' {
		rec.Value = req.value
	} else {
		rec.Value = r.value
	}
	r.log = append(r.log, rec)
	if !rec.Accepted {
		return fmt.Sprintf("stale %d 0\n", r.value), true
	}
	return fmt.Sprintf("ok %d %d\n", r.value, work.Milliseconds()), true
}
