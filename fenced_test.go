package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/goredisconn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// fencedACL is the ACL selector docs/SECURITY.md gives for the fenced operations on an
// application's keys under stock:, and their fences. The suite's users have it (restrictShared),
// so the fenced tests use keys under stock: and prove the rule enough.
var fencedACL = []string{"(~stock:* ~{stock:*}:dlock-fence +evalsha +eval +get +set +incrby +del +pttl +hget +hset +hincrby)"}

// stockKey is a key under stock: that no other test uses, with a hash tag (its fence is
// <key>:dlock-fence).
func stockKey(t testing.TB) string { return "stock:{" + uniqueName(t) + "}" }

// fenceOf is the fence of a key as docs/PROTOCOL.md names it.
func fenceOf(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key + ":dlock-fence"
		}
	}
	return "{" + key + "}:dlock-fence"
}

// fencedOp is one fenced operation run with a token, for the tests that try them all.
type fencedOp struct {
	name string
	hash bool // works on a hash
	run  func(ctx context.Context, c *dlock.Client, key string, token uint64) error
}

var fencedOps = []fencedOp{
	{"get", false, func(ctx context.Context, c *dlock.Client, key string, token uint64) error {
		_, _, err := c.FencedGet(ctx, key, token)
		return err
	}},
	{"set", false, func(ctx context.Context, c *dlock.Client, key string, token uint64) error {
		return c.FencedSet(ctx, key, strconv.FormatUint(token, 10), token, 0)
	}},
	{"incrby", false, func(ctx context.Context, c *dlock.Client, key string, token uint64) error {
		_, err := c.FencedIncrBy(ctx, key, 1, token)
		return err
	}},
	{"del", false, func(ctx context.Context, c *dlock.Client, key string, token uint64) error {
		_, err := c.FencedDel(ctx, key, token)
		return err
	}},
	{"hget", true, func(ctx context.Context, c *dlock.Client, key string, token uint64) error {
		_, _, err := c.FencedHGet(ctx, key, "f", token)
		return err
	}},
	{"hset", true, func(ctx context.Context, c *dlock.Client, key string, token uint64) error {
		_, err := c.FencedHSet(ctx, key, "f", strconv.FormatUint(token, 10), token)
		return err
	}},
	{"hincrby", true, func(ctx context.Context, c *dlock.Client, key string, token uint64) error {
		_, err := c.FencedHIncrBy(ctx, key, "n", 1, token)
		return err
	}},
}

// dump is what a key holds, for comparing before and after a refused operation.
func dump(t testing.TB, s *redistest.Server, key string) string {
	t.Helper()
	switch typ := redisDo(t, s, "TYPE", key); typ {
	case "hash":
		return typ + " " + redisDo(t, s, "HGETALL", key)
	case "none":
		return typ
	default:
		return typ + " " + redisDo(t, s, "GET", key)
	}
}

// wantStale checks that err is a refusal of token by the fence at fence, naming both.
func wantStale(t testing.TB, err error, token, fence uint64) {
	t.Helper()
	var se *dlock.StaleError
	if !errors.Is(err, dlock.ErrStale) || !errors.As(err, &se) {
		t.Fatalf("err = %v, want ErrStale", err)
	}
	if se.Token != token || se.Fence != fence {
		t.Fatalf("StaleError token %d fence %d, want token %d fence %d", se.Token, se.Fence, token, fence)
	}
	msg := err.Error()
	if !strings.Contains(msg, strconv.FormatUint(token, 10)) || !strings.Contains(msg, strconv.FormatUint(fence, 10)) || strings.Contains(msg, "\n") {
		t.Fatalf("message %q: want one line naming token %d and fence %d", msg, token, fence)
	}
}

// Every fenced operation, through both transports: a token older than the key's fence is
// refused with ErrStale naming both and changes nothing (value, fence and their expiries); the
// fence's own token passes again, and a newer one passes and moves the fence to it.
func TestFenced_RefusesOlderAcceptsEqualAndNewer(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		l, err := c.Mutex(uniqueName(t)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		base := l.Token() // a real token; the others are after it
		l.Unlock(ctx)
		for _, op := range fencedOps {
			t.Run(op.name, func(t *testing.T) {
				key := stockKey(t)
				if op.hash {
					redisDo(t, shared, "HSET", key, "f", "v", "n", "5")
				} else {
					redisDo(t, shared, "SET", key, "7")
				}
				t1, t2, t3 := base, base+16, base+32
				if err := op.run(ctx, c, key, t2); err != nil {
					t.Fatalf("%s with a first token: %v", op.name, err)
				}
				if got := redisDo(t, shared, "GET", fenceOf(key)); got != strconv.FormatUint(t2, 10) {
					t.Fatalf("fence = %q, want %d", got, t2)
				}
				before, fenceTTL := dump(t, shared, key), redisDo(t, shared, "PTTL", fenceOf(key))
				wantStale(t, op.run(ctx, c, key, t1), t1, t2)
				if after := dump(t, shared, key); after != before {
					t.Fatalf("a refused %s changed the key: %q, was %q", op.name, after, before)
				}
				if got := redisDo(t, shared, "GET", fenceOf(key)); got != strconv.FormatUint(t2, 10) {
					t.Fatalf("fence after a refusal = %q, want %d", got, t2)
				}
				if got := redisDo(t, shared, "PTTL", fenceOf(key)); (got == "-1") != (fenceTTL == "-1") {
					t.Fatalf("a refusal changed the fence's expiry: PTTL %s, was %s", got, fenceTTL)
				}
				if err := op.run(ctx, c, key, t2); err != nil {
					t.Fatalf("%s with the fence's own token: %v", op.name, err)
				}
				if err := op.run(ctx, c, key, t3); err != nil {
					t.Fatalf("%s with a newer token: %v", op.name, err)
				}
				if got := redisDo(t, shared, "GET", fenceOf(key)); got != strconv.FormatUint(t3, 10) {
					t.Fatalf("fence = %q, want %d", got, t3)
				}
				wantStale(t, op.run(ctx, c, key, t2), t2, t3)
			})
		}
	})
}

// What each operation does to the value, through both transports, as its Redis command would.
func TestFenced_Values(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		const tok = 1_000_000
		key := stockKey(t)
		if v, ok, err := c.FencedGet(ctx, key, tok); err != nil || ok || v != "" {
			t.Fatalf("FencedGet of a missing key = %q, %v, %v; want \"\", false, nil", v, ok, err)
		}
		if err := c.FencedSet(ctx, key, "a value with spaces\x00and a NUL", tok, 0); err != nil {
			t.Fatal(err)
		}
		if v, ok, err := c.FencedGet(ctx, key, tok); err != nil || !ok || v != "a value with spaces\x00and a NUL" {
			t.Fatalf("FencedGet = %q, %v, %v", v, ok, err)
		}
		if err := c.FencedSet(ctx, key, "10", tok, 0); err != nil {
			t.Fatal(err)
		}
		if n, err := c.FencedIncrBy(ctx, key, -3, tok); err != nil || n != 7 {
			t.Fatalf("FencedIncrBy(-3) = %d, %v; want 7", n, err)
		}
		if existed, err := c.FencedDel(ctx, key, tok); err != nil || !existed {
			t.Fatalf("FencedDel = %v, %v; want true", existed, err)
		}
		if existed, err := c.FencedDel(ctx, key, tok); err != nil || existed {
			t.Fatalf("FencedDel of a deleted key = %v, %v; want false", existed, err)
		}
		if n, err := c.FencedIncrBy(ctx, key, 5, tok); err != nil || n != 5 {
			t.Fatalf("FencedIncrBy of a missing key = %d, %v; want 5", n, err)
		}
		h := stockKey(t)
		if created, err := c.FencedHSet(ctx, h, "sku-7", "2", tok); err != nil || !created {
			t.Fatalf("FencedHSet = %v, %v; want a new field", created, err)
		}
		if created, err := c.FencedHSet(ctx, h, "sku-7", "3", tok); err != nil || created {
			t.Fatalf("FencedHSet of an existing field = %v, %v; want false", created, err)
		}
		if n, err := c.FencedHIncrBy(ctx, h, "sku-7", -1, tok); err != nil || n != 2 {
			t.Fatalf("FencedHIncrBy = %d, %v; want 2", n, err)
		}
		if v, ok, err := c.FencedHGet(ctx, h, "sku-7", tok); err != nil || !ok || v != "2" {
			t.Fatalf("FencedHGet = %q, %v, %v; want 2", v, ok, err)
		}
		if v, ok, err := c.FencedHGet(ctx, h, "nope", tok); err != nil || ok || v != "" {
			t.Fatalf("FencedHGet of a missing field = %q, %v, %v", v, ok, err)
		}
		// A key without a hash tag: its fence is {<key>}:dlock-fence.
		plain := "stock:" + uniqueName(t)
		if err := c.FencedSet(ctx, plain, "1", tok, 0); err != nil {
			t.Fatal(err)
		}
		if got := redisDo(t, shared, "GET", "{"+plain+"}:dlock-fence"); got != strconv.Itoa(tok) {
			t.Fatalf("fence of %s = %q, want %d", plain, got, tok)
		}
	})
}

// pttl reads a key's PTTL.
func pttl(t testing.TB, s *redistest.Server, key string) time.Duration {
	t.Helper()
	n, err := strconv.ParseInt(redisDo(t, s, "PTTL", key), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if n < 0 {
		return time.Duration(n)
	}
	return time.Duration(n) * time.Millisecond
}

// The fence's expiry follows the value's, and outlives it by the token retention: none while
// the value has none (also after an expiry the value had is removed), the value's plus the
// retention when it has one (INCRBY and HSET keep it), and the retention alone once the value
// is gone: deleted (FencedDel) or expired. Within that time an older token is still refused,
// and cannot bring the key back; then the fence is gone too.
func TestFenced_ExpiryFollowsValue(t *testing.T) {
	needShared(t)
	const keep = dlock.MinTokenRetention
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL(), dlock.WithTokenRetention(keep))
		const t1, t2 = 5_000_000, 5_000_016
		key := stockKey(t)
		fk := fenceOf(key)
		if err := c.FencedSet(ctx, key, "3", t1, 0); err != nil {
			t.Fatal(err)
		}
		if v, f := pttl(t, shared, key), pttl(t, shared, fk); v != -1 || f != -1 {
			t.Fatalf("no expiry: value PTTL %v, fence PTTL %v; want none for both", v, f)
		}
		if err := c.FencedSet(ctx, key, "3", t1, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := c.FencedIncrBy(ctx, key, -1, t1); err != nil {
			t.Fatal(err)
		}
		v, f := pttl(t, shared, key), pttl(t, shared, fk)
		if v < 19*time.Second || v > 20*time.Second || f-v < keep-50*time.Millisecond || f-v > keep+50*time.Millisecond {
			t.Fatalf("value PTTL %v, fence PTTL %v: want about 20s, and the fence %v more", v, f, keep)
		}
		if err := c.FencedSet(ctx, key, "3", t1, 0); err != nil {
			t.Fatal(err)
		}
		if v, f := pttl(t, shared, key), pttl(t, shared, fk); v != -1 || f != -1 {
			t.Fatalf("expiry removed by a set without one: value PTTL %v, fence PTTL %v; want none", v, f)
		}

		// Deleted: the fence stays for the retention and still refuses t1.
		if _, err := c.FencedDel(ctx, key, t2); err != nil {
			t.Fatal(err)
		}
		if got := redisDo(t, shared, "EXISTS", key); got != "0" {
			t.Fatalf("EXISTS after FencedDel = %s", got)
		}
		if f := pttl(t, shared, fk); f <= 0 || f > keep {
			t.Fatalf("fence PTTL after FencedDel = %v, want within the retention %v", f, keep)
		}
		wantStale(t, c.FencedSet(ctx, key, "99", t1, 0), t1, t2)
		if got := redisDo(t, shared, "EXISTS", key); got != "0" {
			t.Fatal("a stale set brought a deleted key back")
		}
		waitFor(t, 10*time.Second, "the deleted key's fence expires", func(ctx context.Context) error {
			if n, _ := shared.Do(ctx, "EXISTS", fk); n != "0" {
				return fmt.Errorf("fence still there (PTTL %v)", pttl(t, shared, fk))
			}
			return nil
		})

		// The fence's own token creating the key again (INCRBY, HSET) makes the fence lasting
		// again: the value has no expiry.
		if _, err := c.FencedDel(ctx, key, t2); err != nil {
			t.Fatal(err)
		}
		if _, err := c.FencedIncrBy(ctx, key, 1, t2); err != nil {
			t.Fatal(err)
		}
		if v, f := pttl(t, shared, key), pttl(t, shared, fk); v != -1 || f != -1 {
			t.Fatalf("INCRBY created the key: value PTTL %v, fence PTTL %v; want none for both", v, f)
		}
		h := stockKey(t)
		if _, err := c.FencedDel(ctx, h, t2); err != nil {
			t.Fatal(err)
		}
		if _, err := c.FencedHSet(ctx, h, "f", "v", t2); err != nil {
			t.Fatal(err)
		}
		if v, f := pttl(t, shared, h), pttl(t, shared, fenceOf(h)); v != -1 || f != -1 {
			t.Fatalf("HSET created the hash: value PTTL %v, fence PTTL %v; want none for both", v, f)
		}
		if _, err := c.FencedDel(ctx, key, t2); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the fence expires", func(ctx context.Context) error {
			if n, _ := shared.Do(ctx, "EXISTS", fk); n != "0" {
				return errors.New("fence still there")
			}
			return nil
		})

		// Expired: the same, from the value's own expiry.
		if err := c.FencedSet(ctx, key, "1", t2, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the value expires", func(ctx context.Context) error {
			if n, _ := shared.Do(ctx, "EXISTS", key); n != "0" {
				return errors.New("value still there")
			}
			return nil
		})
		if n, _ := shared.Do(ctx, "EXISTS", fk); n == "1" { // a loaded machine may take the whole retention to look
			wantStale(t, c.FencedSet(ctx, key, "99", t1, 0), t1, t2)
		}
		waitFor(t, 10*time.Second, "the expired value's fence expires", func(ctx context.Context) error {
			if n, _ := shared.Do(ctx, "EXISTS", fk); n != "0" {
				return errors.New("fence still there")
			}
			return nil
		})
		// Nothing is left of the key: any token may use it again.
		if err := c.FencedSet(ctx, key, "1", t1, 0); err != nil {
			t.Fatalf("FencedSet after the fence expired: %v", err)
		}
	})
}

// A paused holder, with real leases: A takes the lock (token t1) with a short fixed lease and
// uses the key, then stops; its lease runs out, B takes the lock (t2 > t1) and writes; A's late
// FencedIncrBy is refused with ErrStale naming t2, and the key holds B's write alone. Then the
// read-modify-write: A reads (claiming t1's successor's place), B reads and writes back, A's
// write-back is refused. A and B use different transports, both ways round.
func TestFenced_PausedHolder(t *testing.T) {
	needShared(t)
	for _, pair := range [][2]transport{{transports[0], transports[1]}, {transports[1], transports[0]}} {
		t.Run(pair[0].name+"-then-"+pair[1].name, func(t *testing.T) {
			ctx := ctxT(t)
			a, b := pair[0].dial(t, shared.URL()), pair[1].dial(t, shared.URL())
			name, key := uniqueName(t), stockKey(t)
			redisDo(t, shared, "SET", key, "10")
			short := []dlock.Option{dlock.WithTTL(50 * time.Millisecond), dlock.WithoutRenewal()}

			la, err := a.Mutex(name, short...).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t1 := la.Token()
			if n, err := a.FencedIncrBy(ctx, key, -1, t1); err != nil || n != 9 {
				t.Fatalf("A's FencedIncrBy = %d, %v; want 9", n, err)
			}
			// A is paused: it does nothing until its lease has run out and B holds the lock.
			lb, err := b.Mutex(name).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer lb.Unlock(ctx)
			t2 := lb.Token()
			if t2 <= t1 {
				t.Fatalf("B's token %d not after A's %d", t2, t1)
			}
			if n, err := b.FencedIncrBy(ctx, key, -1, t2); err != nil || n != 8 {
				t.Fatalf("B's FencedIncrBy = %d, %v; want 8", n, err)
			}
			_, err = a.FencedIncrBy(context.Background(), key, -1, t1) // A wakes up and goes on
			wantStale(t, err, t1, t2)
			if got := redisDo(t, shared, "GET", key); got != "8" {
				t.Fatalf("stock = %s after A's refused decrement, want 8", got)
			}

			// Read-modify-write, with A's lease taken again and lost again.
			lb.Unlock(ctx)
			la, err = a.Mutex(name, short...).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t3 := la.Token()
			v, _, err := a.FencedGet(ctx, key, t3)
			if err != nil || v != "8" {
				t.Fatalf("A's FencedGet = %q, %v; want 8", v, err)
			}
			lb, err = b.Mutex(name).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t4 := lb.Token()
			vb, _, err := b.FencedGet(ctx, key, t4)
			if err != nil || vb != "8" {
				t.Fatalf("B's FencedGet = %q, %v; want 8", vb, err)
			}
			if err := b.FencedSet(ctx, key, "7", t4, 0); err != nil {
				t.Fatal(err)
			}
			wantStale(t, a.FencedSet(context.Background(), key, "7", t3, 0), t3, t4)
			if got := redisDo(t, shared, "GET", key); got != "7" {
				t.Fatalf("stock = %s, want 7: one sale each for A's read and B's", got)
			}
		})
	}
}

// The stock deduction under contention: buyers in two clients (one per transport), on real
// leases of one name with a short fixed lease, read the stock with FencedGet, work, and write
// one less back with FencedSet, regardless of their lease (as a holder paused between checking
// it and writing would). Some stall past their lease, so others take the lock meanwhile, and
// their late writes must be refused. No decrement is lost or duplicated: every accepted write
// wrote a different value, and the final stock is the initial one less the accepted writes.
func TestFenced_ConcurrentStock(t *testing.T) {
	needShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients := []*dlock.Client{transports[0].dial(t, shared.URL()), transports[1].dial(t, shared.URL())}
	name, key := uniqueName(t), stockKey(t)
	const initial, buyers = 60, 8
	const lease = 30 * time.Millisecond
	redisDo(t, shared, "SET", key, strconv.Itoa(initial))
	var (
		accepted, stale atomic.Int64
		mu              sync.Mutex
		written         = map[int]int{} // value -> writes of it accepted
		wg              sync.WaitGroup
		errs            = make(chan error, buyers)
	)
	for g := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[g%2]
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for ctx.Err() == nil {
				l, err := c.Mutex(name, dlock.WithTTL(lease), dlock.WithoutRenewal()).Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				tok := l.Token()
				v, _, err := c.FencedGet(ctx, key, tok)
				if errors.Is(err, dlock.ErrStale) {
					stale.Add(1)
					l.Unlock(ctx)
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				n, _ := strconv.Atoi(v)
				if n <= 0 {
					l.Unlock(ctx)
					return
				}
				if rng.IntN(5) == 0 {
					time.Sleep(3 * lease) // a stall past the lease: someone else takes the lock
				}
				switch err := c.FencedSet(ctx, key, strconv.Itoa(n-1), tok, 0); {
				case err == nil:
					accepted.Add(1)
					mu.Lock()
					written[n-1]++
					mu.Unlock()
				case errors.Is(err, dlock.ErrStale):
					stale.Add(1)
				default:
					errs <- err
					return
				}
				l.Unlock(ctx)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	final, _ := strconv.Atoi(redisDo(t, shared, "GET", key))
	t.Logf("%d writes accepted, %d refused as stale, stock %d of %d", accepted.Load(), stale.Load(), final, initial)
	if final != 0 || accepted.Load() != initial {
		t.Fatalf("stock %d after %d accepted decrements of %d: want 0 after exactly %d", final, accepted.Load(), initial, initial)
	}
	for v, n := range written {
		if n != 1 {
			t.Errorf("value %d written %d times: a duplicated decrement", v, n)
		}
	}
	if stale.Load() == 0 {
		t.Error("no write was refused: the stalls did not overlap another holder, so the test proved nothing")
	}
}

// On a Redis Cluster, as the ACL user of docs/SECURITY.md's Cluster rule with the fenced
// selector, through both transports: keys with and without a hash tag on every master are
// fenced (the fence shares the key's slot, so the script runs), a stale token is refused there
// too, and a key whose fence could not share its slot is refused with ErrInvalid.
func TestFenced_Cluster(t *testing.T) {
	rule := append(append(append([]string(nil), redistest.ACLRule...), redistest.ACLClusterExtra...), fencedACL...)
	g := redistest.NewCluster(t, redistest.WithArgs(redistest.ACLUserArgs(testUser, testPassword, rule...)...))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := strings.Replace(g.URL(), "://", "://"+testUser+":"+testPassword+"@", 1)
	r, err := dlock.Dial(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: g.Addrs(), Username: testUser, Password: testPassword, ContextTimeoutEnabled: true})
	defer rc.Close()
	gr, err := dlock.New(goredisconn.New(rc))
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Close()
	masters := g.Masters()
	for tr, c := range map[string]*dlock.Client{"rueidis": r, "goredis": gr} {
		for i, m := range masters {
			for _, form := range []string{"stock:{%s-%d-%d}", "stock:%s-%d-%d"} {
				var key string
				for n := 0; ; n++ { // a key whose slot this master owns
					key = fmt.Sprintf(form, tr, i, n)
					if owner, err := g.MasterOfSlot(ctx, redistest.SlotOf(key)); err == nil && owner == m {
						break
					}
				}
				const t1, t2 = 7_000_000, 7_000_016
				if err := c.FencedSet(ctx, key, "5", t2, 0); err != nil {
					t.Fatalf("%s: FencedSet %s: %v", tr, key, err)
				}
				if n, err := c.FencedIncrBy(ctx, key, -1, t2); err != nil || n != 4 {
					t.Fatalf("%s: FencedIncrBy %s = %d, %v", tr, key, n, err)
				}
				// The reads (whose replies hold strings, so they take the transport's plain
				// command path) go straight to the key's master: no other master sees the script,
				// not even to answer MOVED.
				for _, o := range masters {
					if _, err := o.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
						t.Fatal(err)
					}
				}
				for range 6 {
					if v, _, err := c.FencedGet(ctx, key, t2); err != nil || v != "4" {
						t.Fatalf("%s: FencedGet %s = %q, %v", tr, key, v, err)
					}
				}
				for _, o := range masters {
					stats, err := o.Do(ctx, "INFO", "commandstats")
					if err != nil {
						t.Fatal(err)
					}
					if sent := strings.Contains(stats, "cmdstat_evalsha:"); sent != (o == m) {
						t.Errorf("%s: FencedGet %s: EVALSHA on master %s = %v, want only on the key's master %s", tr, key, o.Addr, sent, m.Addr)
					}
				}
				_, err := c.FencedIncrBy(ctx, key, -1, t1)
				wantStale(t, err, t1, t2)
				_, _, err = c.FencedGet(ctx, key, t1)
				wantStale(t, err, t1, t2)
				if got, err := m.Do(ctx, "GET", fenceOf(key)); err != nil || got != strconv.Itoa(t2) {
					t.Fatalf("%s: fence of %s on its master = %q, %v", tr, key, got, err)
				}
			}
		}
		for _, bad := range []string{"stock:a}b", "stock:{}x}"} {
			if err := c.FencedSet(ctx, bad, "1", 1, 0); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("%s: FencedSet %q = %v, want ErrInvalid (no hash tag, and a '}')", tr, bad, err)
			}
		}
	}
}

// Through Sentinel, with each way of reaching the master: the fenced operations run on the
// master the Sentinels name, and refuse a stale token there.
func TestFenced_Sentinel(t *testing.T) {
	g := redistest.NewSentinel(t)
	ctx := ctxT(t)
	for _, tr := range sentinelTransports {
		c := tr.dial(t, g)
		key := "stock:{" + tr.name + "}"
		const t1, t2 = 8_000_000, 8_000_016
		if err := c.FencedSet(ctx, key, "3", t2, 0); err != nil {
			t.Fatalf("%s: FencedSet: %v", tr.name, err)
		}
		if n, err := c.FencedIncrBy(ctx, key, -1, t2); err != nil || n != 2 {
			t.Fatalf("%s: FencedIncrBy = %d, %v", tr.name, n, err)
		}
		_, err := c.FencedIncrBy(ctx, key, -1, t1)
		wantStale(t, err, t1, t2)
		if got, err := g.Master().Do(ctx, "GET", key); err != nil || got != "2" {
			t.Fatalf("%s: stock on the master = %q, %v; want 2", tr.name, got, err)
		}
	}
}

// A quorum client has no fenced operations: each refuses at once with ErrInvalid saying so.
func TestFenced_QuorumRefused(t *testing.T) {
	srv := startN(t, 3)
	ctx := ctxT(t)
	for _, tr := range quorumTransports {
		c := tr.dial(t, serverAddrs(srv))
		for _, op := range fencedOps {
			err := op.run(ctx, c, "stock:{q}", 1)
			if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "quorum") {
				t.Errorf("%s: %s in quorum mode = %v, want ErrInvalid naming quorum mode", tr.name, op.name, err)
			}
		}
		for _, s := range srv {
			if n, _ := s.Do(ctx, "EXISTS", "stock:{q}", "stock:{q}:dlock-fence"); n != "0" {
				t.Errorf("%s: a refused fenced operation wrote on %s", tr.name, s.Addr)
			}
		}
	}
}

// Bad input is ErrInvalid on one line, before anything is sent: an empty key, a key under the
// client's prefix, token 0 or one not below 2^53, a negative or sub-millisecond TTL, a key
// whose fence could not share its slot. A key of another type, and a value that is not an
// integer, are ErrInvalid from the server, and change nothing (the fence stays). After Close:
// ErrClosed.
func TestFenced_BadInput(t *testing.T) {
	needShared(t)
	eachTransport(t, func(t *testing.T, tr transport) {
		ctx := ctxT(t)
		c := tr.dial(t, shared.URL())
		key := stockKey(t)
		cases := []struct {
			what string
			err  error
		}{
			{"empty key", c.FencedSet(ctx, "", "1", 1, 0)},
			{"empty key (get)", func() error { _, _, err := c.FencedGet(ctx, "", 1); return err }()},
			{"key under the prefix", c.FencedSet(ctx, dlock.DefaultPrefix+"{x}", "1", 1, 0)},
			{"token 0", c.FencedSet(ctx, key, "1", 0, 0)},
			{"token 0 (incrby)", func() error { _, err := c.FencedIncrBy(ctx, key, 1, 0); return err }()},
			{"token 2^53", func() error { _, err := c.FencedDel(ctx, key, 1<<53); return err }()},
			{"negative ttl", c.FencedSet(ctx, key, "1", 1, -time.Second)},
			{"sub-millisecond ttl", c.FencedSet(ctx, key, "1", 1, time.Microsecond)},
			{"a '}' without a hash tag", c.FencedSet(ctx, "stock:a}b", "1", 1, 0)},
		}
		for _, tc := range cases {
			if !errors.Is(tc.err, dlock.ErrInvalid) || strings.Contains(tc.err.Error(), "\n") {
				t.Errorf("%s: %v, want ErrInvalid on one line", tc.what, tc.err)
			}
		}
		if n := redisDo(t, shared, "EXISTS", key, fenceOf(key)); n != "0" {
			t.Fatalf("refused input wrote %s keys", n)
		}

		const tok = 9_000_000
		if err := c.FencedSet(ctx, key, "not a number", tok, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := c.FencedIncrBy(ctx, key, 1, tok+16); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("FencedIncrBy of a non-integer = %v, want ErrInvalid", err)
		}
		if _, err := c.FencedHSet(ctx, key, "f", "v", tok+16); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("FencedHSet of a string = %v, want ErrInvalid (WRONGTYPE)", err)
		}
		if got := redisDo(t, shared, "GET", fenceOf(key)); got != strconv.Itoa(tok) {
			t.Errorf("fence after failed operations = %s, want %d unchanged", got, tok)
		}
		if got := redisDo(t, shared, "GET", key); got != "not a number" {
			t.Errorf("value after failed operations = %q", got)
		}
		c.Close()
		if err := c.FencedSet(ctx, key, "1", tok, 0); !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("FencedSet after Close = %v, want ErrClosed", err)
		}
	})
}

// docs/SECURITY.md shows the selector the suite gives its users for the fenced operations.
func TestFenced_ACLDocumented(t *testing.T) {
	doc, err := os.ReadFile("docs/SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, rule := range fencedACL {
		if !strings.Contains(string(doc), rule) {
			t.Errorf("docs/SECURITY.md does not show the fenced operations' selector %s", rule)
		}
	}
}
