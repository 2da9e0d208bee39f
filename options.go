package dlock

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/protocol"
	"github.com/dlock-go/dlock/internal/timing"
)

const (
	// DefaultTTL is the lease a lock gets when no WithTTL option is given.
	DefaultTTL = 10 * time.Second
	// MaxTTL is the longest lease accepted with renewal: a renewed lease stays held as long as
	// its holder lives, so a longer TTL only delays the recovery from a crashed holder.
	MaxTTL = 10 * time.Minute
	// MaxFixedTTL is the longest lease accepted without renewal (WithoutRenewal, Extend of such
	// a lease): long enough for "at most once a day".
	MaxFixedTTL = 7 * 24 * time.Hour
	// MinTTL is the shortest lease accepted: below it, one network round trip and the drift
	// allowance leave nothing for renewal.
	MinTTL = 10 * time.Millisecond
	// MaxNameLen is the longest lock name accepted, in bytes.
	MaxNameLen = 512
	// DefaultPrefix starts every key and channel dlock uses.
	DefaultPrefix = "dlock:"
	// DefaultTokenRetention is how long a released name keeps its last fencing token on the
	// server when no WithTokenRetention option is given.
	DefaultTokenRetention = time.Minute
	// MinTokenRetention is the shortest WithTokenRetention accepted.
	MinTokenRetention = time.Second
)

// Option configures one lock (Mutex, Do): its lease, label, wait bound and replica
// acknowledgement. Passed to Dial, New, DialQuorum or NewQuorum, it sets the default of every
// lock of that client, which a lock's own options override.
type Option func(*options)

// ClientOption configures a Client: Dial, New, DialQuorum and NewQuorum take them. Every
// Option is also a ClientOption (the client's default for its locks); the options that only
// make sense for a whole client (WithPrefix, WithTLSConfig, WithCAFile, WithLogger,
// WithObserver, WithUnsafeEviction, WithTokenRetention) are ClientOptions alone, so passing
// one to a lock does not compile.
type ClientOption interface {
	applyClient(*options)
}

func (f Option) applyClient(o *options) { f(o) }

// clientOnly is a ClientOption that is not an Option.
type clientOnly func(*options)

func (f clientOnly) applyClient(o *options) { f(o) }

type options struct {
	ttl       time.Duration
	renew     bool
	prefix    string
	label     string
	ackN      int           // replicas that must acknowledge each acquisition and renewal
	ackWait   time.Duration // how long to wait for them
	tlsConfig *tls.Config   // Dial, DialQuorum: TLS settings (WithTLSConfig, WithCAFile)
	evictOK   bool          // WithUnsafeEviction
	retention time.Duration // WithTokenRetention
	wait      time.Duration // WithWait; negative: no bound
	logger    *slog.Logger  // WithLogger; nil: slog.Default()
	observers []Observer    // WithObserver
	ownerConn bool          // Dial: Close closes the connection it made
	adapt     adaptive      // WithAdaptiveTTL (adaptive.go); ttl is then its greatest lease
	holdKeep  time.Duration // WithHoldStatsRetention
	slice     time.Duration // WithTurnSlice (slice.go)
	err       error

	ttlMS    string        // ms(ttlMSFor), kept by the client's options (ttlArg)
	ttlMSFor time.Duration // the ttl ttlMS is for
}

// ttlArg is ms(o.ttl), without formatting it again for every handle of the client's own TTL.
func (o *options) ttlArg() string {
	if o.ttlMS != "" && o.ttlMSFor == o.ttl {
		return o.ttlMS
	}
	return protocol.Millis(o.ttl)
}

func defaultOptions() options {
	return options{ttl: DefaultTTL, renew: true, prefix: DefaultPrefix, retention: DefaultTokenRetention, wait: -1, holdKeep: DefaultHoldStatsRetention}
}

func (o options) with(opts []Option) options {
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

func (o options) withClient(opts []ClientOption) options {
	for _, opt := range opts {
		if opt != nil {
			opt.applyClient(&o)
		}
	}
	return o
}

func (o *options) fail(err error) {
	if o.err == nil {
		o.err = err
	}
}

// WithTTL sets the lease: how long the server keeps the lock if its holder stops renewing it
// (crashed, paused or partitioned). With renewal on, the lease is renewed every ttl/3, so a
// crashed holder's lock frees within ttl. The default is DefaultTTL (10s); the minimum is MinTTL,
// the maximum MaxTTL with renewal and MaxFixedTTL without (WithoutRenewal). Of WithTTL and
// WithAdaptiveTTL, the last one given applies.
func WithTTL(ttl time.Duration) Option {
	return func(o *options) {
		if ttl < MinTTL {
			o.fail(fmt.Errorf("%w: ttl %v is below the minimum %v", ErrInvalid, ttl, MinTTL))
			return
		}
		o.ttl = ttl
		o.adapt = adaptive{}
	}
}

// WithoutRenewal gives a fixed lease: the lock is held for the TTL unless Extend is called,
// and the lease context is cancelled (cause ErrLost) when the TTL could have run out.
// The default is to renew automatically while the lease is held.
func WithoutRenewal() Option {
	return func(o *options) { o.renew = false }
}

// WithPrefix sets the prefix of every key and channel of the client, so that several
// applications can share one server. It must not be empty (the keys would mix with the
// application's own) nor contain '{' or '}' (the lock name is the cluster hash tag). Inspect,
// List and the dlock command (--key-prefix) see the locks of one prefix at a time. The default
// is DefaultPrefix ("dlock:").
func WithPrefix(prefix string) ClientOption {
	return clientOnly(func(o *options) {
		if prefix == "" {
			o.fail(fmt.Errorf("%w: empty prefix (lock keys would mix with the application's own keys)", ErrInvalid))
			return
		}
		if strings.ContainsAny(prefix, "{}") {
			o.fail(fmt.Errorf("%w: prefix %q contains '{' or '}'", ErrInvalid, prefix))
			return
		}
		o.prefix = prefix
	})
}

// WithLabel adds a free-form label to the holder description stored with each lock this
// client takes (beside host, pid and process start), for inspection tools. The default is none.
func WithLabel(label string) Option {
	return func(o *options) {
		if len(label) > 256 {
			o.fail(fmt.Errorf("%w: label longer than 256 bytes", ErrInvalid))
			return
		}
		o.label = label
	}
}

// WithReplicaAck makes every acquisition, renewal and Extend succeed only once n replicas of
// the master have acknowledged it (Redis WAIT, sent right after the script on the same
// connection), waiting at most timeout. An acquisition that is not acknowledged in time is
// released again and fails with an error wrapping ErrReplicaAck; a renewal that is not is
// retried, and the lease is lost if none is acknowledged before its deadline. Use it on a
// master with replicas (Sentinel): a failover to a replica that acknowledged the lock does not
// lose it. It costs one round trip of replication per acquisition. It is off by default, and
// not available in quorum mode (the servers of a quorum are independent masters).
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(o *options) {
		if n < 1 || timeout <= 0 {
			o.fail(fmt.Errorf("%w: WithReplicaAck(%d, %v): need at least one replica and a positive timeout", ErrInvalid, n, timeout))
			return
		}
		o.ackN, o.ackWait = n, timeout
	}
}

// WithTLSConfig makes Dial and DialQuorum connect with TLS using cfg, whatever the URL's scheme
// (with a rediss:// URL and no TLS option, the system's root certificates verify the server).
// New and NewQuorum refuse it (ErrInvalid): configure TLS on the client you pass them.
func WithTLSConfig(cfg *tls.Config) ClientOption {
	return clientOnly(func(o *options) {
		if cfg == nil {
			o.fail(fmt.Errorf("%w: nil TLS config", ErrInvalid))
			return
		}
		o.tlsConfig = cfg
	})
}

// WithCAFile makes Dial and DialQuorum connect with TLS and verify the server's certificate
// against the PEM certificates in path (a private CA) instead of the system's roots.
// New and NewQuorum refuse it (ErrInvalid).
func WithCAFile(path string) ClientOption {
	return clientOnly(func(o *options) {
		pem, err := os.ReadFile(path)
		if err != nil {
			o.fail(fmt.Errorf("%w: CA file: %v", ErrInvalid, err))
			return
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			o.fail(fmt.Errorf("%w: CA file %s holds no PEM certificate", ErrInvalid, path))
			return
		}
		o.tlsConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	})
}

func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: lock name is empty", ErrInvalid)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: lock name is %d bytes, longer than %d", ErrInvalid, len(name), MaxNameLen)
	}
	return nil
}

// drift is how much earlier than the server's expiry a holder treats its lease as over:
// TTL/100 + 2 ms for clock-rate differences (the Redlock allowance), plus TTL/20, at most 50 ms,
// for the delay before the renewal loop's timer runs on a busy machine.
func drift(ttl time.Duration) time.Duration { return timing.Drift(ttl) }

// WithUnsafeEviction lets Dial, New and their quorum forms use servers whose memory policy can
// evict keys (maxmemory set, maxmemory-policy other than noeviction), which they otherwise
// refuse with an error wrapping ErrEvictionPolicy; it logs a warning instead (WithLogger). It
// is unsafe: an evicted lock can be taken by a second client while its holder still believes it
// holds it, so mutual exclusion then rests on fencing tokens alone (see the package
// documentation). A Client option; the default is to refuse.
func WithUnsafeEviction() ClientOption {
	return clientOnly(func(o *options) { o.evictOK = true })
}

// WithLogger sets where the client logs what its caller cannot see from return values: WARN
// for a lost lease (its name, token and cause), for renewal rounds that fail (at most once every
// 10 s while they keep failing; INFO when they succeed again) and for a server that can evict
// lock keys (with WithUnsafeEviction); INFO when the subscription to release notices drops and
// when it is back, and when a server stops evicting; DEBUG for every acquisition and release,
// renewal round and quorum server error. The DEBUG lines of acquisitions and releases are
// written when the logger enables DEBUG as the client is made (or an observer is set: see
// WithObserver), so that a client that logs nothing at DEBUG pays nothing for them. It never
// logs an owner secret or a password. A Client option; the default is slog.Default().
func WithLogger(l *slog.Logger) ClientOption {
	return clientOnly(func(o *options) {
		if l == nil {
			o.fail(fmt.Errorf("%w: nil logger", ErrInvalid))
			return
		}
		o.logger = l
	})
}

// WithTokenRetention sets how long a released lock keeps its last fencing token on the server
// (about 170 bytes per name: docs/PROTOCOL.md, "Memory"). Tokens keep increasing as long as
// the server's clock never steps back by more than the retention (in quorum mode, and the
// servers' clocks differ by less than it). Shorter saves memory where many distinct names are
// locked once each; longer tolerates larger clock steps. A Client option; the default is
// DefaultTokenRetention (1 minute), the minimum MinTokenRetention (1 second).
func WithTokenRetention(d time.Duration) ClientOption {
	return retentionOption("token retention", d, MinTokenRetention, func(o *options) *time.Duration { return &o.retention })
}

// retentionOption is the Client option that sets the retention that field points to (what,
// in its error) to d, refusing a d below least.
func retentionOption(what string, d, least time.Duration, field func(*options) *time.Duration) ClientOption {
	return clientOnly(func(o *options) {
		if d < least {
			o.fail(fmt.Errorf("%w: %s %v is below the minimum %v", ErrInvalid, what, d, least))
			return
		}
		*field(o) = d
	})
}

// WithWait bounds how long Lock and Do wait for the lock (not how long the lock is then held:
// that is the lease, WithTTL). When d passes with the lock held by another owner, Lock returns a
// *NotAcquiredError naming the holder. WithWait(0) makes one attempt, as TryLock does. The
// default is to wait as long as the context allows.
func WithWait(d time.Duration) Option {
	return func(o *options) {
		if d < 0 {
			o.fail(fmt.Errorf("%w: WithWait(%v): negative", ErrInvalid, d))
			return
		}
		o.wait = d
	}
}

// checkTTL reports a lease that is too long for its kind (renewed or fixed).
func checkTTL(ttl time.Duration, renew bool) error {
	switch {
	case renew && ttl > MaxTTL:
		return fmt.Errorf("%w: ttl %v with renewal is above MaxTTL (%v): a renewed lease stays held while its holder lives, so a long TTL only delays recovery from a crash; use WithoutRenewal for a fixed lease (up to %v)",
			ErrInvalid, ttl, MaxTTL, MaxFixedTTL)
	case !renew && ttl > MaxFixedTTL:
		return fmt.Errorf("%w: fixed lease %v is above MaxFixedTTL (%v)", ErrInvalid, ttl, MaxFixedTTL)
	}
	return nil
}
