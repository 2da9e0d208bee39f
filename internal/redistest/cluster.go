package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/dlock-go/dlock/internal/slot"
)

// NumSlots is the number of hash slots of a Redis Cluster.
const NumSlots = slot.Count

const clusterWait = 60 * time.Second // default bound on cluster operations when ctx has none

// ClusterGroup is a Redis Cluster of three shards, each a master and one
// replica, on loopback. Shard i is the i-th by its first slot when created;
// FailoverShard swaps its two servers' roles, MigrateSlot moves a slot
// between shards. Its methods are safe for concurrent use, but changes to the
// topology (FailoverShard, MigrateSlot) run one at a time.
type ClusterGroup struct {
	shards [][2]*Server // the two servers of each shard, in creation order
	nodes  []*Server    // all six
	ids    map[*Server]string

	tmu    sync.Mutex // serializes topology changes
	mu     sync.Mutex
	closed bool
}

// NewCluster starts a cluster like StartCluster and registers tb.Cleanup to
// close it; it calls tb.Fatalf on failure. If the test failed, the nodes'
// logs are logged at cleanup. Under -short it skips tb: six servers take
// seconds to agree on a cluster.
func NewCluster(tb testing.TB, opts ...Option) *ClusterGroup {
	tb.Helper()
	skipSlow(tb, "a Redis Cluster")
	g, err := StartCluster(opts...)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
		return nil
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, s := range g.nodes {
				tb.Logf("%s log (tail):\n%s", s.Addr, redisproc.Tail(s.Log(), 4<<10))
			}
		}
		if err := g.Close(); err != nil {
			tb.Errorf("redistest: %v", err)
		}
	})
	return g
}

// StartCluster starts six servers with --cluster-enabled yes (each with its
// own free bus port), joins them with redis-cli --cluster create
// --cluster-replicas 1 (three masters, one replica each), and returns once
// every node reports cluster_state:ok, every node has the same view of the
// slots, and the replicas are in sync. opts apply to every node; they come
// after the defaults (cluster-node-timeout 5000, diskless syncs without
// delay), so they can override them. The nodes talk to each other (and
// redis-cli to them) as the default user: restrict clients with users
// (ACLUserArgs), not with --requirepass. The caller must call Close.
func StartCluster(opts ...Option) (g *ClusterGroup, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redistest: redis-cli not found on PATH (it comes with the redis-server package): %w", err)
	}
	g = &ClusterGroup{ids: make(map[*Server]string)}
	started := g // "return nil, err" below sets g to nil before this runs
	defer func() {
		if err != nil {
			_ = started.Close()
			g = nil
		}
	}()
	all := append([]Option{
		func(c *config) { c.cluster = true },
		WithArgs("--cluster-node-timeout", "5000", "--repl-diskless-sync-delay", "0"),
	}, opts...)
	for range 6 {
		s, err := StartProcess(all...)
		if err != nil {
			return nil, err
		}
		g.nodes = append(g.nodes, s)
		id, err := s.Do(ctx, "CLUSTER", "MYID")
		if err != nil {
			return nil, fmt.Errorf("redistest: CLUSTER MYID: %w", err)
		}
		g.ids[s] = id
	}
	args := []string{"--cluster", "create"}
	for _, s := range g.nodes {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if pw := g.nodes[0].password; pw != "" {
		args = append(args, "-a", pw, "--no-auth-warning")
	}
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := g.waitAgreed(ctx, nil); err != nil {
		return nil, err
	}
	if err := g.orderShards(ctx); err != nil {
		return nil, err
	}
	return g, g.waitAgreed(ctx, nil)
}

// orderShards fills g.shards from the now agreed view of the slots: each master with slots and
// its replica, ordered by the master's first slot.
func (g *ClusterGroup) orderShards(ctx context.Context) error {
	view, err := g.view(ctx, g.nodes[0])
	if err != nil {
		return err
	}
	type shard struct {
		first int
		pair  [2]*Server
	}
	var shards []shard
	for _, m := range g.nodes {
		first := slices.Index(view.owner[:], g.ids[m])
		if first < 0 {
			continue
		}
		var r *Server
		for _, s := range g.nodes {
			if view.masterOf[g.ids[s]] == g.ids[m] {
				r = s
			}
		}
		if r == nil {
			return fmt.Errorf("redistest: master %s has no replica", m.Addr)
		}
		shards = append(shards, shard{first, [2]*Server{m, r}})
	}
	if len(shards) != 3 {
		return fmt.Errorf("redistest: cluster has %d masters with slots, want 3", len(shards))
	}
	slices.SortFunc(shards, func(a, b shard) int { return a.first - b.first })
	for _, s := range shards {
		g.shards = append(g.shards, s.pair)
	}
	return nil
}

// Addrs returns every node's "127.0.0.1:PORT", usable as seed addresses.
func (g *ClusterGroup) Addrs() []string {
	out := make([]string, len(g.nodes))
	for i, s := range g.nodes {
		out[i] = s.Addr
	}
	return out
}

// URL returns "redis://127.0.0.1:P1?addr=127.0.0.1:P2&addr=..." naming every
// node as a seed (the form rueidis' and go-redis' URL parsers accept).
func (g *ClusterGroup) URL() string {
	addrs := g.Addrs()
	u := "redis://" + addrs[0]
	for i, a := range addrs[1:] {
		if i == 0 {
			u += "?"
		} else {
			u += "&"
		}
		u += "addr=" + a
	}
	return u
}

// Nodes returns all six servers.
func (g *ClusterGroup) Nodes() []*Server { return append([]*Server(nil), g.nodes...) }

// NodeID returns the cluster node ID of s.
func (g *ClusterGroup) NodeID(s *Server) string { return g.ids[s] }

// Masters returns the current master of each shard, in shard order.
func (g *ClusterGroup) Masters() []*Server {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]*Server, len(g.shards))
	for i := range g.shards {
		out[i], _ = g.roles(ctx, i)
	}
	return out
}

// ReplicaOf returns the other server of master's shard (its replica), or nil
// if master is not in this cluster.
func (g *ClusterGroup) ReplicaOf(master *Server) *Server {
	for _, sh := range g.shards {
		switch master {
		case sh[0]:
			return sh[1]
		case sh[1]:
			return sh[0]
		}
	}
	return nil
}

// roles returns shard i's master and replica as the shard's servers report
// their roles (ROLE); if that fails, the creation order.
func (g *ClusterGroup) roles(ctx context.Context, i int) (master, replica *Server) {
	a, b := g.shards[i][0], g.shards[i][1]
	if r, err := role(ctx, b); err == nil && r == "master" {
		return b, a
	}
	return a, b
}

// MasterOfSlot returns the master that owns slot, as the first node sees it.
func (g *ClusterGroup) MasterOfSlot(ctx context.Context, slot int) (*Server, error) {
	v, err := g.view(ctx, g.nodes[0])
	if err != nil {
		return nil, err
	}
	id := v.owner[slot]
	for s, sid := range g.ids {
		if sid == id {
			return s, nil
		}
	}
	return nil, fmt.Errorf("redistest: slot %d has no known owner (%q)", slot, id)
}

// FailoverShard runs CLUSTER FAILOVER on shard i's replica and returns once it
// is the master, the old master is its replica and in sync, and every node
// agrees on the new slot owner. Without a deadline on ctx, it gives up after
// 60 s.
func (g *ClusterGroup) FailoverShard(ctx context.Context, i int) (old, promoted *Server, err error) {
	g.tmu.Lock()
	defer g.tmu.Unlock()
	if i < 0 || i >= len(g.shards) {
		return nil, nil, fmt.Errorf("redistest: no shard %d", i)
	}
	ctx, cancel := withDefaultTimeout(ctx, clusterWait)
	defer cancel()
	old, promoted = g.roles(ctx, i)
	if _, err := promoted.Do(ctx, "CLUSTER", "FAILOVER"); err != nil {
		return old, promoted, fmt.Errorf("redistest: CLUSTER FAILOVER on %s: %w", promoted.Addr, err)
	}
	err = g.waitAgreed(ctx, func(v *clusterView) error {
		if v.masterOf[g.ids[old]] != g.ids[promoted] {
			return fmt.Errorf("%s is not yet a replica of %s", old.Addr, promoted.Addr)
		}
		return nil
	})
	return old, promoted, err
}

// MigrateSlot moves slot to the master to: IMPORTING on to, MIGRATING on the
// owner, MIGRATE of every key in the slot, then CLUSTER SETSLOT NODE on every
// master; it returns once every node agrees that to owns the slot.
func (g *ClusterGroup) MigrateSlot(ctx context.Context, slot int, to *Server) error {
	g.tmu.Lock()
	defer g.tmu.Unlock()
	if slot < 0 || slot >= NumSlots {
		return fmt.Errorf("redistest: bad slot %d", slot)
	}
	ctx, cancel := withDefaultTimeout(ctx, clusterWait)
	defer cancel()
	toID, ok := g.ids[to]
	if !ok {
		return fmt.Errorf("redistest: %s is not a node of this cluster", to.Addr)
	}
	v, err := g.view(ctx, to)
	if err != nil {
		return err
	}
	if v.masterOf[toID] != "" {
		return fmt.Errorf("redistest: %s is a replica", to.Addr)
	}
	fromID := v.owner[slot]
	if fromID == toID {
		return nil
	}
	var from *Server
	for s, id := range g.ids {
		if id == fromID {
			from = s
		}
	}
	if from == nil {
		return fmt.Errorf("redistest: slot %d has no known owner", slot)
	}
	sl := strconv.Itoa(slot)
	steps := []struct {
		s    *Server
		args []string
	}{
		{to, []string{"CLUSTER", "SETSLOT", sl, "IMPORTING", fromID}},
		{from, []string{"CLUSTER", "SETSLOT", sl, "MIGRATING", toID}},
	}
	for _, st := range steps {
		if _, err := st.s.Do(ctx, st.args...); err != nil {
			return fmt.Errorf("redistest: %v on %s: %w", st.args, st.s.Addr, err)
		}
	}
	if err := migrateKeys(ctx, from, to, sl); err != nil {
		return err
	}
	// The new owner first, then the old one, then every other master.
	order := []*Server{to, from}
	for _, s := range g.nodes {
		if s != to && s != from && v.masterOf[g.ids[s]] == "" {
			order = append(order, s)
		}
	}
	for _, s := range order {
		if _, err := s.Do(ctx, "CLUSTER", "SETSLOT", sl, "NODE", toID); err != nil {
			return fmt.Errorf("redistest: SETSLOT NODE on %s: %w", s.Addr, err)
		}
	}
	return g.waitAgreed(ctx, func(v *clusterView) error {
		if v.owner[slot] != toID {
			return fmt.Errorf("slot %d still owned by %s", slot, v.owner[slot])
		}
		return nil
	})
}

// migrateKeys moves every key of slot sl (a decimal string) from from to to with MIGRATE, 100
// at a time, until from has none left in it.
func migrateKeys(ctx context.Context, from, to *Server, sl string) error {
	for {
		keys, err := from.Do(ctx, "CLUSTER", "GETKEYSINSLOT", sl, "100")
		if err != nil {
			return fmt.Errorf("redistest: GETKEYSINSLOT: %w", err)
		}
		if keys == "" {
			return nil
		}
		args := []string{"MIGRATE", "127.0.0.1", strconv.Itoa(to.Port), "", "0", "10000"}
		if to.password != "" {
			args = append(args, "AUTH", to.password)
		}
		args = append(args, "KEYS")
		args = append(args, strings.Split(keys, "\n")...)
		if _, err := from.Do(ctx, args...); err != nil {
			return fmt.Errorf("redistest: MIGRATE: %w", err)
		}
	}
}

// clusterView is one node's CLUSTER NODES, parsed.
type clusterView struct {
	owner    [NumSlots]string  // master node ID per slot ("" when unassigned)
	masterOf map[string]string // node ID -> its master's ID ("" for a master)
	bad      []string          // nodes flagged fail, pfail, handshake or noaddr
}

func (g *ClusterGroup) view(ctx context.Context, s *Server) (*clusterView, error) {
	out, err := s.Do(ctx, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(out)
}

func parseClusterNodes(text string) (*clusterView, error) {
	v := &clusterView{masterOf: make(map[string]string)}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("bad CLUSTER NODES line %q", line)
		}
		id, flags, master := f[0], f[2], f[3]
		for _, fl := range strings.Split(flags, ",") {
			switch fl {
			case "fail", "fail?", "handshake", "noaddr":
				v.bad = append(v.bad, id+" "+fl)
			}
		}
		if master != "-" {
			v.masterOf[id] = master
		} else {
			v.masterOf[id] = ""
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being imported or migrated
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err := strconv.Atoi(lo)
			if err != nil {
				return nil, fmt.Errorf("bad slot range %q", r)
			}
			b := a
			if isRange {
				if b, err = strconv.Atoi(hi); err != nil {
					return nil, fmt.Errorf("bad slot range %q", r)
				}
			}
			for i := a; i <= b && i < NumSlots; i++ {
				v.owner[i] = id
			}
		}
	}
	return v, nil
}

// waitAgreed waits until every node reports cluster_state:ok, all nodes have
// the same view (slot owners and who replicates whom) with no failing node,
// every slot is served, every replica's link is up, and extra (if non-nil)
// accepts the view.
func (g *ClusterGroup) waitAgreed(ctx context.Context, extra func(*clusterView) error) error {
	return Poll(ctx, "cluster agrees", func(ctx context.Context) error {
		var first *clusterView
		for _, s := range g.nodes {
			info, err := s.Do(ctx, "CLUSTER", "INFO")
			if err != nil {
				return err
			}
			if st := infoFields(info)["cluster_state"]; st != "ok" {
				return fmt.Errorf("%s: cluster_state %s", s.Addr, st)
			}
			v, err := g.view(ctx, s)
			if err != nil {
				return err
			}
			if len(v.bad) > 0 {
				return fmt.Errorf("%s sees %v", s.Addr, v.bad)
			}
			if len(v.masterOf) != len(g.nodes) {
				return fmt.Errorf("%s knows %d nodes", s.Addr, len(v.masterOf))
			}
			if first == nil {
				first = v
				if i := slices.Index(v.owner[:], ""); i >= 0 {
					return fmt.Errorf("slot %d unassigned", i)
				}
				continue
			}
			if v.owner != first.owner {
				return fmt.Errorf("%s sees other slot owners than %s", s.Addr, g.nodes[0].Addr)
			}
			for id, m := range first.masterOf {
				if v.masterOf[id] != m {
					return fmt.Errorf("%s sees %s replicating %q, not %q", s.Addr, id, v.masterOf[id], m)
				}
			}
		}
		for _, s := range g.nodes {
			if first.masterOf[g.ids[s]] == "" {
				continue
			}
			info, err := s.Do(ctx, "INFO", "replication")
			if err != nil {
				return err
			}
			if f := infoFields(info); f["role"] != "slave" || f["master_link_status"] != "up" {
				return fmt.Errorf("replica %s: role %s, link %s", s.Addr, f["role"], f["master_link_status"])
			}
		}
		if extra != nil {
			return extra(first)
		}
		return nil
	})
}

// Close stops every node. It is idempotent.
func (g *ClusterGroup) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.mu.Unlock()
	var errs []error
	for _, s := range g.nodes {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// SlotOf returns the hash slot of key: CRC16 (XMODEM) of its hash tag (the
// part between the first "{" and the next "}", if not empty) or of the
// whole key, modulo 16384.
func SlotOf(key string) int { return slot.Of(key) }
