package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// What run, status, list and unlock add for read-write locks and semaphores, and the resize
// command.

// permitsFlag is run's --permits N/SIZE: hold N permits of the semaphore NAME of SIZE.
type permitsFlag struct {
	n, size int
	set     bool
}

func (p *permitsFlag) String() string {
	if !p.set {
		return ""
	}
	return fmt.Sprintf("%d/%d", p.n, p.size)
}

func (p *permitsFlag) Set(s string) error {
	ns, sizes, ok := strings.Cut(s, "/")
	n, err1 := strconv.Atoi(ns)
	size, err2 := strconv.Atoi(sizes)
	switch {
	case !ok || err1 != nil || err2 != nil:
		return errors.New("want N/SIZE, e.g. 1/3")
	case n < 1 || size < 1 || size > dlock.MaxSemaphoreSize:
		return fmt.Errorf("want 1 <= N <= SIZE <= %d", dlock.MaxSemaphoreSize)
	case n > size:
		return fmt.Errorf("%d permits of a semaphore of %d", n, size)
	}
	p.n, p.size, p.set = n, size, true
	return nil
}

// locker takes the lock run holds: a Mutex, a read or the write hold of an RWMutex, or
// permits of a Semaphore.
type locker interface {
	Lock(ctx context.Context) (*dlock.Lease, error)
	TryLock(ctx context.Context) (*dlock.Lease, error)
}

type readLocker struct{ rw *dlock.RWMutex }

func (r readLocker) Lock(ctx context.Context) (*dlock.Lease, error)    { return r.rw.RLock(ctx) }
func (r readLocker) TryLock(ctx context.Context) (*dlock.Lease, error) { return r.rw.TryRLock(ctx) }

type permitLocker struct {
	s *dlock.Semaphore
	n int
}

func (p permitLocker) Lock(ctx context.Context) (*dlock.Lease, error) { return p.s.Acquire(ctx, p.n) }
func (p permitLocker) TryLock(ctx context.Context) (*dlock.Lease, error) {
	return p.s.TryAcquire(ctx, p.n)
}

// runLocker is the lock run takes with --read, --write or --permits (of the one name), or nil:
// the Mutex of the name, or the MultiMutex of the names.
func runLocker(c *dlock.Client, names []string, read, write bool, permits permitsFlag) locker {
	switch {
	case read:
		return readLocker{c.RWMutex(names[0])}
	case write:
		return c.RWMutex(names[0])
	case permits.set:
		return permitLocker{c.Semaphore(names[0], permits.size), permits.n}
	}
	return nil
}

// printSharedStatus is status's text for a read-write lock or semaphore.
func printSharedStatus(w io.Writer, i dlock.Info) {
	s := i.Shared
	what := "read-write lock"
	if i.Kind == dlock.KindSemaphore {
		what = "semaphore"
	}
	state := "free"
	switch {
	case i.Kind == dlock.KindSemaphore && i.Held:
		state = fmt.Sprintf("%d of %d permits held", s.Permits, s.Size)
	case s.Writer:
		state = "held for writing"
	case i.Held:
		state = "held for reading by " + plural(s.Readers, "reader", "readers")
	}
	fmt.Fprintf(w, "%s: %s, %s\n", display(i.Name), what, state)
	if i.Kind == dlock.KindSemaphore && s.Size > 0 {
		how := "stored by its holders, kept while it is held and for the token retention after"
		if s.SizeSticky {
			how = "set by dlock resize, kept until resized again or reset (dlock resize --reset)"
		}
		fmt.Fprintf(w, "  size:     %d (%s)\n", s.Size, how)
	}
	if i.Kind == dlock.KindRWMutex {
		fmt.Fprintf(w, "  last write token: %d\n", lastWriteToken(i))
	}
	for _, h := range s.Holders {
		role := plural(h.Permits, "permit", "permits")
		if i.Kind == dlock.KindRWMutex {
			role = "reader"
			if h.Write {
				role = "writer"
			}
		}
		fmt.Fprintf(w, "  %-10s %s; token %d, %s, %v left\n", role+":", holderText(h.Holder), h.Token, plural(h.Holds, "hold", "holds"), h.TTL)
		one := dlock.Info{Name: i.Name, Held: true, Holder: h.Holder, TTL: h.TTL}
		if alive, why := holderAlive(one); alive != nil && !*alive {
			fmt.Fprintf(w, "             %s (%s)\n", notRunning(one), why)
		}
	}
	fmt.Fprintf(w, "  waiters:  %s", waitersText(i.Waiters))
	if s.WritersQueued > 0 {
		fmt.Fprintf(w, " (%d to write)", s.WritersQueued)
	}
	fmt.Fprintln(w)
}

// lastWriteToken is the token of a read-write lock's writer, or of its last one.
func lastWriteToken(i dlock.Info) uint64 {
	for _, h := range i.Shared.Holders {
		if h.Write {
			return h.Token
		}
	}
	return i.Token
}

// sharedHolderColumn is list's HOLDER column for a read-write lock or semaphore.
func sharedHolderColumn(i dlock.Info) string {
	s := i.Shared
	if i.Kind == dlock.KindSemaphore {
		return fmt.Sprintf("semaphore: %d/%d permits, %s", s.Permits, s.Size, plural(len(s.Holders), "holder", "holders"))
	}
	if s.Writer {
		return fmt.Sprintf("rw writer %s:%d", orDash(display(i.Holder.Host)), i.Holder.PID)
	}
	return "rw: " + plural(s.Readers, "reader", "readers")
}

// sharedReleased is unlock --force's line for a read-write lock or semaphore.
func sharedReleased(i dlock.Info) string {
	return fmt.Sprintf("released %s: it was held by %s (%s); %s woken",
		display(i.Name), plural(len(i.Shared.Holders), "holder", "holders"), i.Shared, plural(i.Waiters, "waiting client", "waiting clients"))
}

// jsonShared is the JSON of a read-write lock's or semaphore's holders and waiters.
type jsonShared struct {
	Size          int          `json:"size,omitempty"`
	SizeSticky    bool         `json:"size_sticky,omitempty"` // set by dlock resize: kept until reset
	Permits       int          `json:"permits"`
	Writer        bool         `json:"writer"`
	Readers       int          `json:"readers"`
	Queued        int          `json:"queued"`
	WritersQueued int          `json:"writers_queued"`
	Holders       []jsonSharer `json:"holders"`
}

type jsonSharer struct {
	Holder  jsonHolder `json:"holder"`
	Write   bool       `json:"write,omitempty"`
	Permits int        `json:"permits"`
	Holds   int        `json:"holds"`
	Token   uint64     `json:"token"`
	TTLms   int64      `json:"ttl_ms"`
}

func toJSONShared(s *dlock.SharedInfo) *jsonShared {
	if s == nil {
		return nil
	}
	j := &jsonShared{Size: s.Size, SizeSticky: s.SizeSticky, Permits: s.Permits, Writer: s.Writer, Readers: s.Readers, Queued: s.Queued,
		WritersQueued: s.WritersQueued, Holders: []jsonSharer{}}
	for _, h := range s.Holders {
		x := jsonSharer{Holder: jsonHolder{Host: h.Holder.Host, PID: h.Holder.PID, Label: h.Holder.Label},
			Write: h.Write, Permits: h.Permits, Holds: h.Holds, Token: h.Token, TTLms: h.TTL.Milliseconds()}
		if !h.Holder.Start.IsZero() {
			x.Holder.Start = h.Holder.Start.UTC().Format(time.RFC3339)
		}
		j.Holders = append(j.Holders, x)
	}
	return j
}

func runResize(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("resize", "[flags] NAME SIZE | --reset NAME", `
Set the size of the semaphore NAME (how many permits may be held at once across every
process) to SIZE, and say what it changed. The new size applies at once to every process,
whatever size its programs declare (dlock.Client.Semaphore, dlock run --permits N/SIZE): a
declared size is only the one a semaphore is created with when the server stores none.
Permits that a larger size frees are granted at once to the callers waiting, in order. A
smaller size takes nothing from the holders: they keep their permits until they release
them, and no permit is granted until the held ones fit in the new size; a caller waiting
for more permits than the new size fails.

A size set by dlock resize is sticky: the server keeps it, held or idle, until the next
dlock resize. "dlock resize --reset NAME" makes it an ordinary size again, which the server
forgets like one stored by use: at once when nobody holds or waits for the semaphore (the
next holder's declared size counts then), else once the semaphore has been free for the token
retention (one minute by default). Reset the semaphores you no longer resize, so that their
sizes do not stay on the server for good.

It prints one line, for example:
  semaphore backups: resized 2 → 5 (sticky); 2 permits held by 1 holder
  semaphore reports: created: size 4 stored for a semaphore nobody holds yet (sticky)
  semaphore backups: size 5 reset: no longer sticky, forgotten at once (nobody holds it)

Examples:
  dlock resize backups 5
  dlock resize --reset backups

`+textOutputHelp+`

`+serverExitHelp)
	var sf serverFlags
	sf.add(fs)
	reset := fs.Bool("reset", false, "make the size set by an earlier dlock resize an ordinary one again (no SIZE)")
	b64 := addB64Flag(fs)
	pos, done, code := parseInterleaved(fs, std, args)
	if done {
		return code
	}
	want, wantMsg := 2, "want the semaphore's NAME and its new SIZE"
	if *reset {
		want, wantMsg = 1, "--reset wants the semaphore's NAME only"
	}
	if len(pos) != want {
		msg := wantMsg
		if len(pos) > want {
			msg = fmt.Sprintf("unexpected argument %q after NAME", pos[want])
			if want == 2 {
				msg += " SIZE"
			}
		}
		return usageLine(fs, std, msg)
	}
	names, ok := decodeNames(fs, std, pos[:1], *b64)
	if !ok {
		return exitUsage
	}
	name := names[0]
	size := 0
	if !*reset {
		var err error
		size, err = strconv.Atoi(pos[1])
		if err != nil || size < 1 || size > dlock.MaxSemaphoreSize {
			return usageLine(fs, std, fmt.Sprintf("SIZE %q: want a number from 1 to %d", pos[1], dlock.MaxSemaphoreSize))
		}
	}
	c, code := sf.dial(ctx, std, "resize")
	if c == nil {
		return code
	}
	defer c.Close()
	var r dlock.SemaphoreResize
	var err error
	if *reset {
		r, err = c.ResetSemaphoreSize(ctx, name)
	} else {
		r, err = c.ResizeSemaphore(ctx, name, size)
	}
	if err != nil {
		return report(std, "resize", err)
	}
	fmt.Fprintf(std.out, "semaphore %s: %s\n", display(name), resizeText(r, *reset))
	return exitOK
}

// resizeText says what a resize or reset found and did.
func resizeText(r dlock.SemaphoreResize, reset bool) string {
	held := "nobody holds it"
	if r.Holders > 0 {
		held = fmt.Sprintf("%s held by %s", plural(r.Permits, "permit", "permits"), plural(r.Holders, "holder", "holders"))
	}
	switch {
	case reset && r.Old == 0:
		return "no size stored: nothing to reset"
	case reset && !r.OldSticky:
		return fmt.Sprintf("size %d was not set by dlock resize (a holder stored it): nothing to reset", r.Old)
	case reset && r.Size == 0:
		return fmt.Sprintf("size %d reset: no longer sticky, forgotten at once (%s)", r.Old, held)
	case reset:
		return fmt.Sprintf("size %d reset: no longer sticky, forgotten once the semaphore has been free for the token retention; %s", r.Old, held)
	case r.Old == 0 && r.Holders == 0:
		return fmt.Sprintf("created: size %d stored for a semaphore nobody holds yet (sticky)", r.Size)
	case r.Old == r.Size:
		return fmt.Sprintf("size %d unchanged (sticky); %s", r.Size, held)
	}
	return fmt.Sprintf("resized %d → %d (sticky); %s", r.Old, r.Size, held)
}
