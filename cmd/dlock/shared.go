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
		state = fmt.Sprintf("held for reading by %d reader(s)", s.Readers)
	}
	fmt.Fprintf(w, "%s: %s, %s\n", display(i.Name), what, state)
	if i.Kind == dlock.KindSemaphore && s.Size > 0 && !i.Held {
		fmt.Fprintf(w, "  size:     %d\n", s.Size)
	}
	if i.Kind == dlock.KindRWMutex {
		fmt.Fprintf(w, "  last write token: %d\n", lastWriteToken(i))
	}
	for _, h := range s.Holders {
		role := fmt.Sprintf("%d permit(s)", h.Permits)
		if i.Kind == dlock.KindRWMutex {
			role = "reader"
			if h.Write {
				role = "writer"
			}
		}
		fmt.Fprintf(w, "  %-10s %s; token %d, %d hold(s), %v left\n", role+":", holderText(h.Holder), h.Token, h.Holds, h.TTL)
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
		return fmt.Sprintf("semaphore: %d/%d permits, %d holder(s)", s.Permits, s.Size, len(s.Holders))
	}
	if s.Writer {
		return fmt.Sprintf("rw writer %s:%d", orDash(display(i.Holder.Host)), i.Holder.PID)
	}
	return fmt.Sprintf("rw: %d reader(s)", s.Readers)
}

// sharedReleased is unlock --force's line for a read-write lock or semaphore.
func sharedReleased(i dlock.Info) string {
	return fmt.Sprintf("released %s: it was held by %d holder(s) (%s); %d waiting client(s) woken",
		display(i.Name), len(i.Shared.Holders), i.Shared, i.Waiters)
}

// jsonShared is the JSON of a read-write lock's or semaphore's holders and waiters.
type jsonShared struct {
	Size          int          `json:"size,omitempty"`
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
	j := &jsonShared{Size: s.Size, Permits: s.Permits, Writer: s.Writer, Readers: s.Readers, Queued: s.Queued,
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
	fs := newFlagSetSynopsis("resize", "[flags] NAME SIZE", `
Set the size of the semaphore NAME (how many permits may be held at once across every
process) to SIZE, and print the former size. Permits that the new size frees are granted at
once to the callers waiting, in order; a smaller size takes nothing from the holders (new
permits are granted once the held ones fit). Programs that declare another size
(dlock.Client.Semaphore, dlock run --permits N/SIZE) fail from then on with an error naming
the stored size: restart them with the new one. The size is kept while the semaphore is held
and for the token retention after (one minute by default); then the next holder's declared
size counts.

Example:
  dlock resize backups 5

`+serverExitHelp)
	var sf serverFlags
	sf.add(fs)
	pos, done, code := parseInterleaved(fs, std, args)
	if done {
		return code
	}
	if len(pos) != 2 {
		msg := "want the semaphore's NAME and its new SIZE"
		if len(pos) > 2 {
			msg = fmt.Sprintf("unexpected argument %q after NAME SIZE", pos[2])
		}
		return usageLine(fs, std, msg)
	}
	size, err := strconv.Atoi(pos[1])
	if err != nil || size < 1 || size > dlock.MaxSemaphoreSize {
		return usageLine(fs, std, fmt.Sprintf("SIZE %q: want a number from 1 to %d", pos[1], dlock.MaxSemaphoreSize))
	}
	c, code := sf.dial(ctx, std, "resize")
	if c == nil {
		return code
	}
	defer c.Close()
	old, err := c.ResizeSemaphore(ctx, pos[0], size)
	if err != nil {
		return report(std, "resize", err)
	}
	if old == 0 {
		fmt.Fprintf(std.out, "semaphore %s: size %d (none was stored: nobody held it lately)\n", display(pos[0]), size)
	} else {
		fmt.Fprintf(std.out, "semaphore %s: size %d, was %d\n", display(pos[0]), size, old)
	}
	return exitOK
}
