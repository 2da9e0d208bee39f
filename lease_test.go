package dlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Row "releasing someone else's lock": an expired holder's Unlock cannot free the next
// holder's lock, and neither can any other owner.
func TestForeignRelease_Impossible(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		a := tr.dial(t, shared.URL())
		b := tr.dial(t, shared.URL())
		la, err := a.Mutex(name, dlock.WithTTL(100*time.Millisecond), dlock.WithoutRenewal()).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		<-la.Context().Done() // the fixed lease runs out
		lb, err := b.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer lb.Unlock(context.Background())
		err = la.Unlock(ctx)
		if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("stale Unlock: got %v, want ErrLost and ErrNotHeld", err)
		}
		if err := la.Extend(ctx, time.Second); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("stale Extend: got %v, want ErrLost", err)
		}
		if _, err := a.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("after the stale Unlock the lock must still be b's: TryLock got %v", err)
		}
		if lb.Context().Err() != nil {
			t.Fatalf("b's lease ended: %v", context.Cause(lb.Context()))
		}
	})
}

// Row "holder paused past its lease": a SIGSTOPped holder learns of the loss the moment it
// runs again, before it can do one more protected step, and the next holder's token is larger.
func TestPausedHolder_LearnsLossBeforeSecondHolder(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		const ttl = 300 * time.Millisecond
		ctx := ctxT(t)
		name := uniqueName(t)
		h, token := startHelper(t, "work", shared.URL(), name, ttl)
		c := tr.dial(t, shared.URL())
		waitForWrites(t, name, 3)
		h.signal(t, syscall.SIGSTOP)
		l, err := c.Mutex(name).Lock(ctx) // waits out the paused holder's lease
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		if l.Token() <= token {
			t.Fatalf("second holder's token %d, want > paused holder's %d", l.Token(), token)
		}
		marker := "second-holder:" + strconv.FormatUint(l.Token(), 10)
		redisDo(t, shared, "RPUSH", name+":writes", marker)
		h.signal(t, syscall.SIGCONT)
		if line := h.next(t, 10*time.Second); !strings.HasPrefix(line, "lost "+dlock.ErrLost.Error()) {
			t.Fatalf("resumed holder said %q, want %q…", line, "lost "+dlock.ErrLost.Error())
		}
		// A write whose context check came just before the SIGSTOP is sent after the resume:
		// that one write is the case fencing exists for. Every check after the resume must
		// report the loss, so there is never a second.
		writes := strings.Split(redisDo(t, shared, "LRANGE", name+":writes", "0", "-1"), "\n")
		for i, w := range writes {
			if w == marker && len(writes)-1-i > 1 {
				t.Fatalf("paused holder wrote %v after the second holder acquired", writes[i+1:])
			}
		}
	})
}

func waitForWrites(t *testing.T, name string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("the helper to write %d times", n), func(context.Context) error {
		if got, _ := strconv.Atoi(redisDo(t, shared, "LLEN", name+":writes")); got < n {
			return fmt.Errorf("%d writes", got)
		}
		return nil
	})
}

// Memory stays bounded: what a name leaves behind after release expires.
func TestFencingToken_StateExpiresAfterRelease(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		name := uniqueName(t)
		c := tr.dial(t, shared.URL())
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.Unlock(ctx)
		pttl, _ := strconv.Atoi(redisDo(t, shared, "PTTL", keyOf(name)))
		if pttl <= 0 || pttl > int(time.Minute/time.Millisecond) {
			t.Fatalf("PTTL of a released name = %d ms, want in (0, 60000]", pttl)
		}
		if v := lockValue(t, name); len(v) != 3 || v[0] != "-" || v[2] != "0" {
			t.Fatalf("value kept after release = %q, want only the token", v)
		}
	})
}

// A deferred Unlock with the request's cancelled context still releases the lock.
func TestUnlock_WithCancelledContextStillReleases(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URL())
		name := uniqueName(t)
		reqCtx, cancel := context.WithCancel(context.Background())
		l, err := c.Mutex(name).Lock(reqCtx)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := l.Unlock(reqCtx); err != nil {
			t.Fatal(err)
		}
		if v := lockValue(t, name); v[0] != "-" {
			t.Fatalf("lock still held after Unlock with a cancelled context: value %q", v)
		}
	})
}

func TestExtendAndTTL(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTTL(time.Second), dlock.WithoutRenewal())
		l, err := c.Mutex(uniqueName(t)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		if err := l.Extend(ctx, 5*time.Millisecond); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Extend below MinTTL: got %v, want ErrInvalid", err)
		}
		if err := l.Extend(ctx, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		d, err := l.TTL(ctx)
		if err != nil || d <= 10*time.Second || d > 20*time.Second {
			t.Fatalf("TTL after Extend(20s) = %v, %v", d, err)
		}
	})
}

func TestTokenRetention(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTokenRetention(2*time.Second))
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		pttl, err := shared.Do(ctx, "PTTL", keyOf(name))
		if err != nil {
			t.Fatal(err)
		}
		if ms, err := strconv.Atoi(pttl); err != nil || ms <= 0 || ms > 2000 {
			t.Fatalf("released key's PTTL = %s ms, want within the 2 s retention", pttl)
		}
	})
	if _, err := dlock.Dial(ctxT(t), shared.URL(), dlock.WithTokenRetention(time.Millisecond)); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("retention below the minimum: %v, want ErrInvalid", err)
	}
}

// A real token (a Mutex's, a semaphore's) is the server's clock in microseconds, below 2^53,
// so a JSON number decoded as float64 (encoding/json into interface{}, JavaScript) and the
// scripts' Lua doubles hold it exactly: it survives the round trip unchanged.
func TestFencingToken_FitsAFloat64(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		l, err := c.Mutex(uniqueName(t)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		s, err := c.Semaphore(uniqueName(t), 2).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Unlock(ctx)
		for what, token := range map[string]uint64{"mutex": l.Token(), "semaphore": s.Token()} {
			if token >= 1<<53 {
				t.Fatalf("%s token %d is not below 2^53", what, token)
			}
			// The server is this machine: its clock in µs is ours, within the test's time.
			if now := uint64(time.Now().UnixMicro()); token > now+uint64(time.Minute/time.Microsecond) || token+uint64(time.Hour/time.Microsecond) < now {
				t.Errorf("%s token %d is not the server's time in µs (now %d)", what, token, now)
			}
			b, err := json.Marshal(map[string]uint64{"token": token})
			if err != nil {
				t.Fatal(err)
			}
			var back any
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			f, ok := back.(map[string]any)["token"].(float64)
			if !ok || uint64(f) != token || float64(token) != f {
				t.Fatalf("%s token %d came back from JSON %s as %v", what, token, b, back)
			}
		}
	})
}
