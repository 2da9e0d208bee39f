package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
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
//
// The register lives in the server's memory, or in a store (store.go): an SQLite row fenced
// by package fence, or a Redis key fenced by the Client's fenced operations. With a store, the
// server applies each request through it, still one at a time under its mutex, and the store's
// fence, not the server's comparison, decides what is refused: the server only records where
// the two disagree (fenceMismatches), and the final value is read back from the store.

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
	// only, if set, limits the trap to the requests it accepts (by goroutine and token). It is
	// called with the resource's lock held: it may read the record (prevLease), nothing more.
	only func(w who, token uint64) bool
	// fire runs in the request's goroutine before the request is applied. It returns the
	// work time to hand back to the worker and whether to drop the request unanswered.
	fire func(w who, token uint64) (work time.Duration, drop bool)
}

func (op opRecord) who() who { return who{op.Slot, op.Inc, op.G} }

type resource struct {
	fenced bool
	store  registerStore // nil: the register is value, fenced by maxToken
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
	// With a store: requests it failed (the harness's problems), and those its fence decided
	// otherwise than the server's comparison of tokens would have (fenced mode).
	storeErrs  []string
	mismatches []string
}

// startResource starts the resource server on loopback; store nil keeps the register in its
// memory. Close closes the store.
func startResource(fenced bool, store registerStore) (*resource, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("resource server: %w", err)
	}
	r := &resource{fenced: fenced, store: store, ln: ln, conns: make(map[net.Conn]struct{})}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *resource) Addr() string { return r.ln.Addr().String() }

// prevLease returns the last operation recorded of a lease other than tok's, if any. The caller
// holds r.mu (a trap's only).
func (r *resource) prevLease(tok uint64) (opRecord, bool) {
	for i := len(r.log) - 1; i >= 0 && i >= len(r.log)-8; i-- {
		if r.log[i].Token != tok {
			return r.log[i], true
		}
	}
	return opRecord{}, false
}

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

// snapshot returns the final register value and a copy of the record. With a store, the
// value is the store's, read back when the server closed.
func (r *resource) snapshot() (int64, []opRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.value, append([]opRecord(nil), r.log...)
}

// storeProblems returns the requests the store failed, and the store's own failures to read
// the final value or close: problems of the harness, not of the lock.
func (r *resource) storeProblems() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.storeErrs)
}

// fenceMismatches returns, in fenced mode with a store, the requests whose outcome the store's
// fence decided otherwise than the server's comparison of tokens (applied one at a time, the
// store's fence is the largest token it accepted, so the two must agree): a stale token
// accepted, or the holder's own refused.
func (r *resource) fenceMismatches() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.mismatches)
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
	if r.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeOpTimeout)
	defer cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	v, err := r.store.final(ctx)
	if err != nil {
		r.storeErrs = append(r.storeErrs, fmt.Sprintf("read the register's final value from its store: %v", err))
	} else {
		r.value = v
	}
	if err := r.store.close(); err != nil {
		r.storeErrs = append(r.storeErrs, fmt.Sprintf("close the register's store: %v", err))
	}
	r.store = nil
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
	if t != nil && t.op == req.op && (t.only == nil || t.only(req.w, req.token)) {
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
	if r.store != nil {
		return r.doStore(req, work)
	}
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

// doStore applies req through the store, under r.mu: the store's fence decides, fenced, whether
// it is refused. The record is stamped once the store has answered (the operation took effect,
// or was refused, by then, and no other request ran meanwhile). A request the store failed is
// not recorded and gets no answer (ok false): the worker's connection closes, and the run's
// report names the failure as the harness's.
func (r *resource) doStore(req request, work time.Duration) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), storeOpTimeout)
	defer cancel()
	var accepted bool
	var err error
	v := req.value
	if req.op == 'W' {
		accepted, err = r.store.write(ctx, r.fenced, req.token, req.value)
	} else {
		v, accepted, err = r.store.read(ctx, r.fenced, req.token)
	}
	if err != nil {
		r.storeErrs = append(r.storeErrs, fmt.Sprintf("%c by %s token %d: the store failed: %v", req.op, req.w, req.token, err))
		return "", false
	}
	rec := opRecord{T: mono(), Op: req.op, Slot: req.w.Slot, Inc: req.w.Inc, G: req.w.G, Seq: req.seq, Token: req.token, Accepted: accepted}
	rec.Stale = req.token < r.maxToken
	if r.fenced && accepted == rec.Stale {
		what := "accepted a token below the highest seen"
		if !accepted {
			what = "refused a token not below the highest seen"
		}
		r.mismatches = append(r.mismatches, fmt.Sprintf("%c by %s token %d (highest seen %d): the store's fence %s", req.op, req.w, req.token, r.maxToken, what))
	}
	if accepted {
		r.maxToken = max(r.maxToken, req.token)
		r.value = v // the register as this request left or found it
		if req.op == 'W' {
			r.writes++
		}
	}
	rec.Value = v
	if req.op == 'R' && !accepted {
		rec.Value = r.value // a refused read returned nothing: note the register as last seen
	}
	r.log = append(r.log, rec)
	if !accepted {
		return fmt.Sprintf("stale %d 0\n", r.value), true
	}
	return fmt.Sprintf("ok %d %d\n", v, work.Milliseconds()), true
}
