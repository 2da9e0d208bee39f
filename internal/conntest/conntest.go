// Package conntest holds the checks both transport adapters (rueidisconn, goredisconn) must
// pass, written once against the conn interface: WAIT batches, a Sentinel failover, and a
// Cluster's sharded pub/sub and slot moves. Each adapter's tests make the Conn and call them.
package conntest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/redistest"
)

// SetScript sets KEYS[1] to ARGV[1].
var SetScript = conn.NewScript("set.lua", "redis.call('SET', KEYS[1], ARGV[1]) return 1")

// ACLUser and ACLPassword name the restricted user the Sentinel and Cluster checks run as.
const ACLUser, ACLPassword = "dlock", "pw"

// SentinelRule and ClusterRule are docs/SECURITY.md's rules for those deployments.
func SentinelRule() []string {
	return append(append([]string(nil), redistest.ACLRule...), redistest.ACLSentinelExtra...)
}

func ClusterRule() []string {
	return append(append([]string(nil), redistest.ACLRule...), redistest.ACLClusterExtra...)
}

// WithUser puts the restricted user's credentials into a URL.
func WithUser(url string) string {
	return strings.Replace(url, "://", "://"+ACLUser+":"+ACLPassword+"@", 1)
}

// Ctx returns a context that ends after d or with the test.
func Ctx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// MustDo runs a command on s and fails the test on error.
func MustDo(t *testing.T, s *redistest.Server, args ...string) string {
	t.Helper()
	v, err := s.Do(Ctx(t, 10*time.Second), args...)
	if err != nil {
		t.Fatalf("%v on %s: %v", args, s.Addr, err)
	}
	return v
}

// StartReplicated starts a master and one replica in sync with it.
func StartReplicated(t *testing.T) (master, replica *redistest.Server) {
	master = redistest.Start(t, redistest.WithArgs("--repl-diskless-sync-delay", "0"))
	replica = redistest.Start(t, redistest.WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(master.Port)))
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(MustDo(t, replica, "INFO", "replication"), "master_link_status:up") {
		if time.Now().After(deadline) {
			t.Fatal("replica never synced")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return master, replica
}

// waitCalls returns a command's call count on s (INFO commandstats).
func waitCalls(t *testing.T, s *redistest.Server) int {
	for _, line := range strings.Split(MustDo(t, s, "INFO", "commandstats"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_wait:calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(v, ",", 2)[0])
			return n
		}
	}
	return 0
}

// Wait: a WAIT in a batch covers the scripts before it on the same connection; with the
// replica stopped it times out with 0 acknowledgements (a WAIT on another connection, which made
// no write, would count the replica at once).
func Wait(t *testing.T, dial func(t *testing.T, url string) conn.Conn) {
	master, replica := StartReplicated(t)
	c := dial(t, master.URL())
	ctx := Ctx(t, 30*time.Second)
	batch := func(timeout time.Duration) []conn.Result {
		return c.EvalMulti(ctx, []conn.Call{
			{Script: SetScript, Keys: []string{"a"}, Args: []string{"1"}},
			{Script: SetScript, Keys: []string{"b"}, Args: []string{"2"}},
			{WaitReplicas: 1, WaitTimeout: timeout},
		})
	}
	res := batch(5 * time.Second)
	for i, r := range res {
		if r.Err != nil || len(r.Ints) != 1 || r.Ints[0] != 1 {
			t.Fatalf("result %d = %+v, want {1}", i, r)
		}
	}
	if got := MustDo(t, replica, "GET", "b"); got != "2" {
		t.Errorf("replica has b = %q after WAIT acknowledged", got)
	}

	// After SCRIPT FLUSH the scripts are re-sent with EVAL, and so is the WAIT after them.
	MustDo(t, master, "SCRIPT", "FLUSH")
	before := waitCalls(t, master)
	res = batch(5 * time.Second)
	if res[2].Err != nil || res[2].Ints[0] != 1 || res[0].Ints[0] != 1 {
		t.Fatalf("after SCRIPT FLUSH: %+v", res)
	}
	if n := waitCalls(t, master) - before; n != 2 {
		t.Errorf("WAIT sent %d times with a NOSCRIPT fallback, want 2 (again after the EVALs)", n)
	}

	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res = batch(300 * time.Millisecond)
	elapsed := time.Since(start)
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	if res[2].Err != nil || len(res[2].Ints) != 1 || res[2].Ints[0] != 0 {
		t.Fatalf("WAIT with the replica stopped = %+v, want {0}", res[2])
	}
	if elapsed < 250*time.Millisecond {
		t.Errorf("WAIT returned after %v, before its 300 ms timeout", elapsed)
	}
	// The connection is still good for ordinary pipelines.
	res = c.EvalMulti(ctx, []conn.Call{{Script: SetScript, Keys: []string{"c"}, Args: []string{"3"}}})
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
}

// Cluster checks a cluster Conn: WAIT batches split by slot, SSUBSCRIBE on each channel's
// master, and a slot migration or a shard failover never leaving a listener silently dead.
func Cluster(t *testing.T, ctx context.Context, g *redistest.ClusterGroup, c conn.Conn) {
	masters := g.Masters()
	names := channelPerMaster(t, ctx, g, masters)
	var calls []conn.Call
	for _, n := range names {
		calls = append(calls, conn.Call{Script: SetScript, Keys: []string{n + ":key"}, Args: []string{"v"}})
	}
	calls = append(calls, conn.Call{WaitReplicas: 1, WaitTimeout: 5 * time.Second})
	res := c.EvalMulti(ctx, calls)
	for i, r := range res {
		if r.Err != nil || len(r.Ints) != 1 || r.Ints[0] != 1 {
			t.Fatalf("result %d = %+v, want {1}", i, r)
		}
	}
	ln := clusterPubSub(t, ctx, c, masters, names)
	defer ln.Close()
	clusterSlotMove(t, ctx, g, c, ln, masters, names)
	ln.Close()
	clusterFailover(t, ctx, g, c, names[1])
}

// channelPerMaster returns one release channel (and key prefix) per master of g, in the order
// of masters: a name whose slot that master owns.
func channelPerMaster(t *testing.T, ctx context.Context, g *redistest.ClusterGroup, masters []*redistest.Server) []string {
	names := make([]string, len(masters))
	for i, m := range masters {
		for n := 0; ; n++ {
			name := fmt.Sprintf("dlock:{n%d}:rel", n)
			if owner, err := g.MasterOfSlot(ctx, redistest.SlotOf(name)); err == nil && owner == m {
				names[i] = name
				break
			}
		}
	}
	return names
}

// recorder is a listener's handler that keeps the last message and the count of
// subscription confirmations per channel.
type recorder struct {
	mu         sync.Mutex
	subscribed map[string]int
	got        map[string]string
}

func newRecorder() *recorder {
	return &recorder{subscribed: make(map[string]int), got: make(map[string]string)}
}

func (r *recorder) handler() conn.Handler {
	return conn.Handler{
		Message: func(ch, msg string) {
			r.mu.Lock()
			r.got[ch] = msg
			r.mu.Unlock()
		},
		Subscribed: func(ch string) {
			r.mu.Lock()
			r.subscribed[ch]++
			r.mu.Unlock()
		},
	}
}

// counts returns how many channels were confirmed subscribed and how many got a message.
func (r *recorder) counts() (subscribed, got int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subscribed), len(r.got)
}

// on returns the confirmations and the last message of channel ch.
func (r *recorder) on(ch string) (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.subscribed[ch], r.got[ch]
}

// clusterPubSub checks that one listener subscribes to names, one channel per master (masters,
// in the same order), over one connection per node, gets what each master SPUBLISHes, and is
// not ended by its own SUNSUBSCRIBE. It returns the listener, still open.
func clusterPubSub(t *testing.T, ctx context.Context, c conn.Conn, masters []*redistest.Server, names []string) conn.Listener {
	rec := newRecorder()
	ln, err := c.Listen(ctx, rec.handler())
	if err != nil {
		t.Fatal(err)
	}
	if err := ln.Subscribe(ctx, names...); err != nil {
		ln.Close()
		t.Fatal(err)
	}
	WaitFor(t, "ssubscribe confirmations", func() bool { s, _ := rec.counts(); return s == len(names) })
	for i, m := range masters {
		if n := MustDo(t, m, "SPUBLISH", names[i], "tok"+strconv.Itoa(i)); n != "1" {
			t.Errorf("SPUBLISH %s on %s reached %s subscribers, want 1", names[i], m.Addr, n)
		}
		// One connection per node: each master has exactly one shard-channel subscriber client.
		if n := MustDo(t, m, "PUBSUB", "SHARDNUMSUB", names[i]); !strings.HasSuffix(n, "\n1") {
			t.Errorf("SHARDNUMSUB on %s = %q", m.Addr, n)
		}
	}
	WaitFor(t, "smessages", func() bool { _, g := rec.counts(); return g == len(names) })
	for i, n := range names {
		if _, msg := rec.on(n); msg != "tok"+strconv.Itoa(i) {
			t.Errorf("message on %s = %q", n, msg)
		}
	}
	// Our own SUNSUBSCRIBE does not end the listener.
	if err := ln.Unsubscribe(ctx, names[2]); err != nil {
		ln.Close()
		t.Fatal(err)
	}
	WaitFor(t, "unsubscribed", func() bool { return strings.HasSuffix(MustDo(t, masters[2], "PUBSUB", "SHARDNUMSUB", names[2]), "\n0") })
	select {
	case err := <-ln.Done():
		ln.Close()
		t.Fatalf("listener ended after our own unsubscribe: %v", err)
	default:
	}
	return ln
}

// clusterSlotMove checks that moving the slot of names[0], which ln is subscribed to, from its
// master to masters[1] ends ln with an error, and that a listener opened before the move that
// subscribes to the channel afterwards (on the old owner) fails too.
func clusterSlotMove(t *testing.T, ctx context.Context, g *redistest.ClusterGroup, c conn.Conn, ln conn.Listener, masters []*redistest.Server, names []string) {
	early, err := c.Listen(ctx, conn.Handler{Message: func(string, string) {}, Subscribed: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	if err := g.MigrateSlot(ctx, redistest.SlotOf(names[0]), masters[1]); err != nil {
		t.Fatal(err)
	}
	if err := early.Subscribe(ctx, names[0]); err != nil {
		t.Logf("subscribing on the old owner: %v", err)
	} else {
		select {
		case err := <-early.Done():
			t.Logf("subscribing on the old owner: Done: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatal("subscribing on the old owner neither failed nor ended the listener")
		}
	}
	select {
	case err := <-ln.Done():
		if err == nil {
			t.Error("Done closed without an error after the slot moved")
		} else {
			t.Logf("after the slot moved: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("listener still open 20 s after its channel's slot moved")
	}
}

// clusterFailover checks that after a manual failover of the shard of channel name (shard 1),
// a subscription made on its old master either still gets the shard's messages (Redis
// forwards SPUBLISH to every node of the shard) or ends the listener: it is never silently
// dead.
func clusterFailover(t *testing.T, ctx context.Context, g *redistest.ClusterGroup, c conn.Conn, name string) {
	rec := newRecorder()
	ln, err := c.Listen(ctx, rec.handler())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := ln.Subscribe(ctx, name); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, "ssubscribe confirmation", func() bool { s, _ := rec.on(name); return s == 1 })
	_, promoted, err := g.FailoverShard(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	MustDo(t, promoted, "SPUBLISH", name, "after-failover")
	deadline := time.After(20 * time.Second)
	for {
		if _, msg := rec.on(name); msg == "after-failover" {
			t.Log("after a failover: the subscription still gets the shard's messages")
			return
		}
		select {
		case err := <-ln.Done():
			t.Logf("after a failover: the listener ended: %v", err)
			return
		case <-deadline:
			t.Fatal("after a failover: neither the message nor the end of the listener")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Sentinel checks a Conn made through the Sentinels of g: two failovers, after each of which
// writes reach the new master.
func Sentinel(t *testing.T, g *redistest.SentinelGroup, c conn.Conn) {
	ctx := Ctx(t, 120*time.Second)
	if c.(conn.Clustered).Cluster() {
		t.Error("Sentinel client reports Cluster() = true")
	}
	for i := range 2 {
		key := fmt.Sprintf("dlock:k%d", i)
		if _, err := c.Eval(ctx, SetScript, []string{key}, []string{"before"}); err != nil {
			t.Fatal(err)
		}
		_, promoted, err := g.Failover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Calls may fail while the client learns of the failover; then they succeed, on the new master.
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := c.Eval(ctx, SetScript, []string{key}, []string{"after"})
			if err == nil && MustDo(t, promoted, "GET", key) == "after" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("failover %d: no write reached the new master %s; last error %v", i, promoted.Addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
