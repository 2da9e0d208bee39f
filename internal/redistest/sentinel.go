package redistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redisproc"
)

// sentinelConfName is a Sentinel's configuration file in its Dir (Sentinel
// rewrites it with what it learns).
const sentinelConfName = "sentinel.conf"

// Sentinel timings: a master is subjectively down after SentinelDownAfter
// without a valid reply. failover-timeout bounds each failover step and is
// how long a Sentinel waits before retrying a failover that failed.
const (
	SentinelDownAfter       = 1500 * time.Millisecond
	sentinelFailoverTimeout = 3 * time.Second
	sentinelMasterName      = "mymaster"
	failoverWait            = 30 * time.Second // default bound on Failover when ctx has none
)

// SentinelGroup is a master, two replicas and three Sentinels (quorum 2)
// monitoring them, all on loopback. Failover kills the master and brings
// the group back to one master and two in-sync replicas. Its methods are safe
// for concurrent use, but Failover calls run one at a time.
type SentinelGroup struct {
	name      string
	opts      []Option  // the data servers' options
	data      []*Server // master and replicas; roles change with Failover
	sentinels []*Server

	fmu    sync.Mutex // serializes Failover
	mu     sync.Mutex
	master *Server
	closed bool
}

// NewSentinel starts a group like StartSentinel and registers tb.Cleanup to
// close it; it calls tb.Fatalf on failure. If the test failed, the servers'
// logs are logged at cleanup. Under -short it skips tb: six processes take
// seconds to settle.
func NewSentinel(tb testing.TB, opts ...Option) *SentinelGroup {
	tb.Helper()
	skipSlow(tb, "a Sentinel group")
	g, err := StartSentinel(opts...)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
		return nil
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, s := range append(append([]*Server(nil), g.data...), g.sentinels...) {
				tb.Logf("%s log (tail):\n%s", s.Addr, redisproc.Tail(s.Log(), 4<<10))
			}
		}
		if err := g.Close(); err != nil {
			tb.Errorf("redistest: %v", err)
		}
	})
	return g
}

// StartSentinel starts a master, two replicas of it and three Sentinels
// monitoring it under the name "mymaster" with quorum 2, and returns once the
// replicas are in sync and every Sentinel knows both replicas and the other
// two Sentinels. opts apply to the three data servers (not the Sentinels),
// also when Failover restarts one. The Sentinels log in as the default user
// without a password: restrict access with users (ACLUserArgs), not with
// --requirepass. The caller must call Close.
func StartSentinel(opts ...Option) (g *SentinelGroup, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), failoverWait)
	defer cancel()
	g = &SentinelGroup{name: sentinelMasterName, opts: opts}
	started := g // "return nil, err" below sets g to nil before this runs
	defer func() {
		if err != nil {
			_ = started.Close()
			g = nil
		}
	}()
	// Diskless full syncs start at once (the default waits 5 s for more
	// replicas): a restarted old master catches up quickly.
	opts = append([]Option{WithArgs("--repl-diskless-sync-delay", "0")}, opts...)
	g.opts = opts
	master, err := StartProcess(opts...)
	if err != nil {
		return nil, err
	}
	g.data = append(g.data, master)
	g.master = master
	for range 2 {
		r, err := StartProcess(append(opts[:len(opts):len(opts)], replicaOf(master))...)
		if err != nil {
			return nil, err
		}
		g.data = append(g.data, r)
	}
	if err := g.waitReplication(ctx, master); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s %[3]d\n"+
		"sentinel failover-timeout %[1]s %[4]d\n"+
		"sentinel parallel-syncs %[1]s 2\n",
		g.name, master.Port, SentinelDownAfter.Milliseconds(), sentinelFailoverTimeout.Milliseconds())
	for range 3 {
		s, err := StartProcess(func(c *config) { c.sentinelConf = conf })
		if err != nil {
			return nil, err
		}
		g.sentinels = append(g.sentinels, s)
	}
	if err := g.waitSentinels(ctx, master); err != nil {
		return nil, err
	}
	return g, nil
}

// replicaOf makes a server start as a replica of m.
func replicaOf(m *Server) Option {
	return WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(m.Port))
}

// MasterName returns the name the Sentinels monitor the master under.
func (g *SentinelGroup) MasterName() string { return g.name }

// SentinelAddrs returns the Sentinels' "127.0.0.1:PORT" addresses.
func (g *SentinelGroup) SentinelAddrs() []string {
	out := make([]string, len(g.sentinels))
	for i, s := range g.sentinels {
		out[i] = s.Addr
	}
	return out
}

// Sentinels returns the Sentinel processes.
func (g *SentinelGroup) Sentinels() []*Server { return append([]*Server(nil), g.sentinels...) }

// URL returns "redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/mymaster".
func (g *SentinelGroup) URL() string {
	return "redis+sentinel://" + strings.Join(g.SentinelAddrs(), ",") + "/" + g.name
}

// Master returns the current master as the Sentinels see it: the server all
// three name. While they do not agree (during a failover), or cannot be
// asked, it returns the master they last agreed on.
func (g *SentinelGroup) Master() *Server {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if addr, err := g.agreedMaster(ctx); err == nil {
		if s := g.byAddr(addr); s != nil {
			return s
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.master
}

// Replicas returns the two data servers that are not Master().
func (g *SentinelGroup) Replicas() []*Server {
	m := g.Master()
	var out []*Server
	for _, s := range g.data {
		if s != m {
			out = append(out, s)
		}
	}
	return out
}

// Failover kills the master with SIGKILL, waits until every Sentinel names
// the same promoted replica as master and that server has the master role,
// then restarts the old master empty (no persistence) as a replica of the new
// one, and returns once both replicas are in sync and every Sentinel sees
// them. Without a deadline on ctx, it gives up after 30 s. It returns the old
// and the new master.
func (g *SentinelGroup) Failover(ctx context.Context) (old, promoted *Server, err error) {
	g.fmu.Lock()
	defer g.fmu.Unlock()
	ctx, cancel := withDefaultTimeout(ctx, failoverWait)
	defer cancel()
	old = g.Master()
	g.mu.Lock()
	g.master = old
	g.mu.Unlock()
	if err := old.Kill(); err != nil {
		return nil, nil, err
	}
	err = Poll(ctx, "sentinels promote a replica", func(ctx context.Context) error {
		addr, err := g.agreedMaster(ctx)
		if err != nil {
			return err
		}
		if addr == old.Addr {
			return errors.New("sentinels still name the killed master")
		}
		for _, s := range g.data {
			if s.Addr == addr {
				r, err := role(ctx, s)
				if err != nil {
					return err
				}
				if r != "master" {
					return fmt.Errorf("%s is named master but has role %s", addr, r)
				}
				promoted = s
				return nil
			}
		}
		return fmt.Errorf("sentinels name unknown master %s", addr)
	})
	if err != nil {
		return old, nil, err
	}
	g.mu.Lock()
	g.master = promoted
	g.mu.Unlock()

	old.mu.Lock()
	old.args = append(g.optArgs(), "--replicaof", "127.0.0.1", strconv.Itoa(promoted.Port))
	old.mu.Unlock()
	if err := old.Restart(); err != nil {
		return old, promoted, err
	}
	// Settle on whatever master the Sentinels agree on by then (should they
	// have failed over once more meanwhile, follow them).
	err = Poll(ctx, "group settles after failover", func(ctx context.Context) error {
		addr, err := g.agreedMaster(ctx)
		if err != nil {
			return err
		}
		m := g.byAddr(addr)
		if m == nil || m == old {
			return fmt.Errorf("sentinels name %s", addr)
		}
		if err := g.replicationOK(ctx, m); err != nil {
			return err
		}
		if err := g.sentinelsOK(ctx, m); err != nil {
			return err
		}
		promoted = m
		return nil
	})
	g.mu.Lock()
	g.master = promoted
	g.mu.Unlock()
	return old, promoted, err
}

func (g *SentinelGroup) byAddr(addr string) *Server {
	for _, s := range g.data {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// optArgs returns the extra arguments of the data servers' options.
func (g *SentinelGroup) optArgs() []string {
	var c config
	for _, o := range g.opts {
		o(&c)
	}
	return c.args
}

// agreedMaster returns the master address every Sentinel reports, or an error
// if they differ.
func (g *SentinelGroup) agreedMaster(ctx context.Context) (string, error) {
	var first string
	for i, s := range g.sentinels {
		r, err := s.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.name)
		if err != nil {
			return "", err
		}
		host, port, _ := strings.Cut(r, "\n")
		addr := host + ":" + port
		if i == 0 {
			first = addr
		} else if addr != first {
			return "", fmt.Errorf("sentinels disagree: %s and %s", first, addr)
		}
	}
	return first, nil
}

// waitReplication waits until master has the master role and the other two
// data servers are its replicas, online, with their link up.
func (g *SentinelGroup) waitReplication(ctx context.Context, master *Server) error {
	return Poll(ctx, "replicas in sync with "+master.Addr, func(ctx context.Context) error {
		return g.replicationOK(ctx, master)
	})
}

func (g *SentinelGroup) replicationOK(ctx context.Context, master *Server) error {
	{
		info, err := master.Do(ctx, "INFO", "replication")
		if err != nil {
			return err
		}
		f := infoFields(info)
		if f["role"] != "master" {
			return fmt.Errorf("%s has role %s", master.Addr, f["role"])
		}
		online := 0
		for k, v := range f {
			if strings.HasPrefix(k, "slave") && strings.Contains(v, "state=online") {
				online++
			}
		}
		if online != len(g.data)-1 {
			return fmt.Errorf("%s has %d online replicas", master.Addr, online)
		}
		for _, s := range g.data {
			if s == master {
				continue
			}
			info, err := s.Do(ctx, "INFO", "replication")
			if err != nil {
				return err
			}
			f := infoFields(info)
			if f["master_port"] != strconv.Itoa(master.Port) || f["master_link_status"] != "up" {
				return fmt.Errorf("%s: master_port %s, link %s", s.Addr, f["master_port"], f["master_link_status"])
			}
		}
		return nil
	}
}

// waitSentinels waits until every Sentinel names master, knows the two other
// Sentinels, and sees both replicas up (no down or disconnected flag), and no
// failover is in progress: the state from which the next Failover works.
func (g *SentinelGroup) waitSentinels(ctx context.Context, master *Server) error {
	return Poll(ctx, "sentinels settle on "+master.Addr, func(ctx context.Context) error {
		return g.sentinelsOK(ctx, master)
	})
}

func (g *SentinelGroup) sentinelsOK(ctx context.Context, master *Server) error {
	{
		for _, s := range g.sentinels {
			r, err := s.Do(ctx, "SENTINEL", "MASTER", g.name)
			if err != nil {
				return err
			}
			m := records(r, "name")[0]
			if m["port"] != strconv.Itoa(master.Port) || m["flags"] != "master" {
				return fmt.Errorf("sentinel %s: master port %s flags %s", s.Addr, m["port"], m["flags"])
			}
			if m["num-other-sentinels"] != strconv.Itoa(len(g.sentinels)-1) {
				return fmt.Errorf("sentinel %s knows %s other sentinels", s.Addr, m["num-other-sentinels"])
			}
			r, err = s.Do(ctx, "SENTINEL", "REPLICAS", g.name)
			if err != nil {
				return err
			}
			up := 0
			for _, rep := range records(r, "name") {
				if rep["flags"] == "slave" && rep["master-port"] == strconv.Itoa(master.Port) {
					up++
				}
			}
			if up != len(g.data)-1 {
				return fmt.Errorf("sentinel %s sees %d healthy replicas", s.Addr, up)
			}
		}
		return nil
	}
}

// Close stops every process of the group. It is idempotent.
func (g *SentinelGroup) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.mu.Unlock()
	var errs []error
	for _, s := range append(append([]*Server(nil), g.sentinels...), g.data...) {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
