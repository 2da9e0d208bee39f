package dlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/backend"
)

// A server whose memory policy can evict keys can drop a held lock's key at any moment, and
// then hand the lock to a second client while the first still holds its lease: the lease
// cannot protect against it. Under maxmemory with any policy but noeviction, lock keys can be
// evicted (they always have a TTL, so the volatile-* policies pick them first). So a Client
// reads every master's memory settings when it is made and refuses a server that can evict,
// unless WithUnsafeEviction says to go on; while it holds leases it reads them again every
// evictionCheckEvery, and if a server can now evict, or evicted keys since the last reading,
// it treats every lease as lost and refuses acquisitions until the server is safe again.

// ErrEvictionPolicy is wrapped by the error of Dial, New and of acquisitions when a Redis server
// can evict lock keys (maxmemory set with a maxmemory-policy other than noeviction), and by the
// cause of leases lost because a server could evict their keys. See WithUnsafeEviction.
var ErrEvictionPolicy = errors.New("dlock: server may evict lock keys")

// evictionCheckEvery is how often a Client that holds leases reads its servers' memory
// settings again; well within a renewal period of the default TTL.
const evictionCheckEvery = time.Second

// evictionError says which server can evict lock keys, and why.
type evictionError struct {
	addr      string
	maxmemory int64
	policy    string
	evicted   int64 // keys evicted since the last reading, when the policy alone does not say
}

func (e *evictionError) Error() string {
	if e.evicted > 0 && (e.policy == "noeviction" || e.maxmemory == 0) {
		return fmt.Sprintf("dlock: server %s evicted %d keys since it was last checked (its maxmemory-policy was changed and changed back?): locks it held may be gone",
			e.addr, e.evicted)
	}
	return fmt.Sprintf("dlock: server %s may evict lock keys: maxmemory is %d bytes with maxmemory-policy %s; set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf), or accept the risk with dlock.WithUnsafeEviction",
		e.addr, e.maxmemory, e.policy)
}

func (e *evictionError) Is(target error) bool { return target == ErrEvictionPolicy }

// serverMemory is what one server's INFO says about evicting keys.
type serverMemory struct {
	maxmemory int64
	policy    string
	evicted   int64
}

func (m serverMemory) mayEvict() bool { return m.maxmemory > 0 && m.policy != "noeviction" }

// parseMemoryInfo reads maxmemory, maxmemory_policy and evicted_keys from an INFO reply.
func parseMemoryInfo(info string) (serverMemory, error) {
	var m serverMemory
	var seen int
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "maxmemory":
			m.maxmemory, err = strconv.ParseInt(v, 10, 64)
			seen++
		case "maxmemory_policy":
			m.policy = v
			seen++
		case "evicted_keys":
			m.evicted, err = strconv.ParseInt(v, 10, 64)
			seen++
		}
		if err != nil {
			return m, fmt.Errorf("INFO field %s: %v", k, err)
		}
	}
	if seen < 3 {
		return m, errors.New("INFO lacks maxmemory, maxmemory_policy or evicted_keys")
	}
	return m, nil
}

// evictionGuard keeps a Client's view of whether its servers can evict lock keys.
type evictionGuard struct {
	b      backend.Backend
	need   int  // servers that must answer: 1, or a quorum's majority
	allow  bool // WithUnsafeEviction: warn, never refuse
	logger *slog.Logger

	atRisk atomic.Bool // risk != nil: acquisitions read it without the lock

	mu      sync.Mutex
	evicted map[string]int64 // per server: evicted_keys at the last reading
	warned  map[string]bool  // per server: the unsafe setting was logged
	risk    error            // set while a server can evict (not with allow)
	checked time.Time        // when risk was last read
}

func newEvictionGuard(b backend.Backend, need int, allow bool, logger *slog.Logger) *evictionGuard {
	return &evictionGuard{b: b, need: need, allow: allow, logger: logger, evicted: make(map[string]int64), warned: make(map[string]bool)}
}

// read asks every master for its memory settings; at least need must answer (in quorum mode
// a minority may be down).
func (g *evictionGuard) read(ctx context.Context) (map[string]serverMemory, error) {
	replies := g.b.Masters(ctx, "INFO", "memory", "stats")
	out := make(map[string]serverMemory, len(replies))
	var errs []error
	for _, r := range replies {
		if r.Err != nil {
			if strings.HasPrefix(r.Err.Error(), "NOPERM") {
				return nil, fmt.Errorf("dlock: server %s refuses INFO to this user, so dlock cannot check that it never evicts lock keys: add +info to the user's ACL rule (docs/SECURITY.md), or accept the risk with dlock.WithUnsafeEviction: %w",
					r.Addr, r.Err)
			}
			if speaksOtherProtocol(r.Err) {
				errs = append(errs, &notRedisError{Addr: r.Addr, Err: r.Err})
				continue
			}
			errs = append(errs, fmt.Errorf("%s: %w", r.Addr, r.Err))
			continue
		}
		s, _ := r.Reply.(string)
		m, err := parseMemoryInfo(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Addr, err))
			continue
		}
		out[r.Addr] = m
	}
	if len(out) < g.need || len(out) == 0 {
		return out, fmt.Errorf("dlock: cannot read the memory policy of the servers: %w", joinErrors(errs...))
	}
	return out, nil
}

// assess compares a reading with the previous one and returns the error of the first server
// that can evict lock keys now, or that evicted keys since the previous reading.
func (g *evictionGuard) assess(mem map[string]serverMemory) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var risk error
	for addr, m := range mem {
		prev, seen := g.evicted[addr]
		g.evicted[addr] = m.evicted
		var delta int64
		if seen && m.evicted > prev { // a counter that went down belongs to a restarted server
			delta = m.evicted - prev
		}
		var e *evictionError
		if m.mayEvict() || delta > 0 {
			e = &evictionError{addr: addr, maxmemory: m.maxmemory, policy: m.policy, evicted: delta}
		}
		if e == nil {
			if g.warned[addr] {
				delete(g.warned, addr)
				g.logger.Info("dlock: server no longer evicts lock keys", "server", addr, "maxmemory_policy", m.policy)
			}
			continue
		}
		if g.allow {
			// Once when the setting is found, and again at every reading that finds keys
			// evicted (at most once per evictionCheckEvery while leases are held).
			if !g.warned[addr] || e.evicted > 0 {
				g.warned[addr] = true
				g.logger.Warn("dlock: server may evict lock keys; going on as WithUnsafeEviction allows: a lock whose key is evicted can be taken by a second client before its holder learns it was lost",
					"server", addr, "maxmemory", m.maxmemory, "maxmemory_policy", m.policy, "evicted_since_last_check", e.evicted)
			}
			continue
		}
		if risk == nil {
			risk = e
		}
	}
	if !g.allow {
		g.risk = risk
		g.checked = time.Now()
		g.atRisk.Store(risk != nil)
	}
	return risk
}

// check reads and assesses the servers; with WithUnsafeEviction it never reports a risk.
func (g *evictionGuard) check(ctx context.Context) (risk, err error) {
	mem, err := g.read(ctx)
	if err != nil {
		if g.allow {
			g.logger.Warn("dlock: cannot check whether the servers may evict lock keys", "error", err)
			return nil, nil
		}
		return nil, err
	}
	return g.assess(mem), nil
}

// refusal returns the error an acquisition gets while a server can evict lock keys. While one
// could, it reads the servers again, at most every evictionCheckEvery/4, so that acquisitions
// resume once the setting is fixed.
func (g *evictionGuard) refusal(ctx context.Context) error {
	if !g.atRisk.Load() {
		return nil
	}
	g.mu.Lock()
	risk, checked := g.risk, g.checked
	g.mu.Unlock()
	if risk == nil {
		return nil
	}
	if time.Since(checked) < evictionCheckEvery/4 {
		return risk
	}
	risk, err := g.check(ctx)
	if err != nil {
		return err
	}
	return risk
}
