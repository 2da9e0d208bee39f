// Package dlockprom exports what dlock's locks do as Prometheus metrics: how long acquisitions
// wait and how they end, how long locks are held, how many leases are held and how many
// goroutines wait, which leases were lost and why, and what the renewal loop costs.
//
//	m, err := dlockprom.New(prometheus.DefaultRegisterer,
//		dlockprom.WithLockLabel(func(name string) string { // "sku:42" -> "sku"
//			class, _, _ := strings.Cut(name, ":")
//			return class
//		}))
//	...
//	c, err := dlock.Dial(ctx, url, dlock.WithObserver(m.Observer()))
//
// Metrics (label lock only with WithLockLabel):
//
//	dlock_acquire_wait_seconds{outcome, path, lock}  histogram: Lock, TryLock and Do, from the
//	    call to its return; outcome acquired, busy, timed_out, cancelled or error; path local
//	    (a local handoff inside the client) or server, "none" when not acquired
//	dlock_hold_seconds{lock}                  histogram: from acquisition to release or loss
//	dlock_leases_held{lock}                   gauge: leases held now
//	dlock_waiters{lock}                       gauge: goroutines waiting for a lock now
//	dlock_leases_lost_total{cause, lock}      counter: refused, force_unlocked, deadline,
//	                                          eviction, expired, closed (dlock.LostCause)
//	dlock_renewal_seconds                     histogram: one renewal round, send to answer
//	dlock_renewal_errors_total                counter: renewal rounds with a renewal that got
//	                                          no answer (each is retried until its deadline)
//	dlock_subscription_drops_total            counter: the release subscription dropped
//	dlock_quorum_server_errors_total{server}  counter: quorum mode, a server's failed calls
//
// There is no lock-name label by default: names are unbounded (a lock per order), and each
// label value is a time series. WithLockLabel maps a name to a bounded class instead.
// One Metrics serves any number of Clients; their figures add up.
package dlockprom

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlock-go/dlock"
)

// Default buckets, in seconds.
var (
	// DefaultWaitBuckets spans an uncontended acquisition (a round trip, well under a
	// millisecond on a LAN) to waits of half a minute.
	DefaultWaitBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	// DefaultHoldBuckets spans an empty critical section to a five-minute job.
	DefaultHoldBuckets = []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300}
	// DefaultRenewalBuckets spans one round trip to a round that nearly missed its leases.
	DefaultRenewalBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
)

// Option configures New.
type Option func(*config)

type config struct {
	lockLabel                          func(string) string
	waitBuckets, holdBuckets, rbuckets []float64
	constLabels                        prometheus.Labels
}

// WithLockLabel adds the label lock to the metrics of locks (wait, hold, held, waiters, lost),
// with f(name) as its value. f must map the unbounded set of lock names to a small set of
// classes ("sku:42" to "sku"), or the metrics grow without bound. It is called on every event,
// so keep it cheap; it must be safe for concurrent use.
func WithLockLabel(f func(name string) string) Option {
	return func(c *config) { c.lockLabel = f }
}

// WithBuckets sets the histogram buckets (seconds) of the wait, hold and renewal histograms; a
// nil slice keeps that histogram's default.
func WithBuckets(wait, hold, renewal []float64) Option {
	return func(c *config) {
		if wait != nil {
			c.waitBuckets = wait
		}
		if hold != nil {
			c.holdBuckets = hold
		}
		if renewal != nil {
			c.rbuckets = renewal
		}
	}
}

// WithConstLabels adds labels with fixed values to every metric, for instance to tell apart
// two Metrics of one process (one per Redis deployment) registered with one registry.
func WithConstLabels(l prometheus.Labels) Option {
	return func(c *config) { c.constLabels = l }
}

// Metrics holds the collectors. Make it with New, give its Observer to dlock.WithObserver.
type Metrics struct {
	lockLabel     func(string) string
	wait          *prometheus.HistogramVec
	hold          *prometheus.HistogramVec
	held          *prometheus.GaugeVec
	waiters       *prometheus.GaugeVec
	lost          *prometheus.CounterVec
	renewal       prometheus.Histogram
	renewalErrors prometheus.Counter
	subDrops      prometheus.Counter
	serverErrors  *prometheus.CounterVec
}

// New makes the metrics and registers them with reg (prometheus.DefaultRegisterer, or a
// registry of your own). It fails when reg already has metrics of these names and labels.
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	if reg == nil {
		return nil, fmt.Errorf("dlockprom: nil registerer")
	}
	cfg := config{waitBuckets: DefaultWaitBuckets, holdBuckets: DefaultHoldBuckets, rbuckets: DefaultRenewalBuckets}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	lockLabels := func(labels ...string) []string {
		if cfg.lockLabel != nil {
			labels = append(labels, "lock")
		}
		return labels
	}
	m := &Metrics{
		lockLabel: cfg.lockLabel,
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dlock_acquire_wait_seconds", ConstLabels: cfg.constLabels, Buckets: cfg.waitBuckets,
			Help: "Time from calling Lock, TryLock or Do to its return, by outcome (acquired, busy, timed_out, cancelled, error) and path (server, local: a handoff inside the client; none when not acquired).",
		}, lockLabels("outcome", "path")),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dlock_hold_seconds", ConstLabels: cfg.constLabels, Buckets: cfg.holdBuckets,
			Help: "Time a lease was held, from its acquisition to its release or loss.",
		}, lockLabels()),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dlock_leases_held", ConstLabels: cfg.constLabels,
			Help: "Leases held now.",
		}, lockLabels()),
		waiters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dlock_waiters", ConstLabels: cfg.constLabels,
			Help: "Goroutines waiting for a lock now.",
		}, lockLabels()),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlock_leases_lost_total", ConstLabels: cfg.constLabels,
			Help: "Leases that ended otherwise than by their release, by cause: refused (the server no longer had it), force_unlocked, deadline (no renewal in time), eviction, expired (a fixed lease ran out), closed (the client closed).",
		}, lockLabels("cause")),
		renewal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dlock_renewal_seconds", ConstLabels: cfg.constLabels, Buckets: cfg.rbuckets,
			Help: "Time of one round of the renewal loop (every due lease of a client in one pipeline), from sending it to its answer.",
		}),
		renewalErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlock_renewal_errors_total", ConstLabels: cfg.constLabels,
			Help: "Renewal rounds in which a lease's renewal got no answer (a transport error); it is retried until the lease's deadline.",
		}),
		subDrops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlock_subscription_drops_total", ConstLabels: cfg.constLabels,
			Help: "Times a client's subscription to release notices dropped (waiters then fall back on lease times until it is back).",
		}),
		serverErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlock_quorum_server_errors_total", ConstLabels: cfg.constLabels,
			Help: "Quorum mode: calls a server answered with an error, or whose connection failed.",
		}, []string{"server"}),
	}
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, done := range m.collectors() {
				if done == c {
					break
				}
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("dlockprom: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.wait, m.hold, m.held, m.waiters, m.lost, m.renewal, m.renewalErrors, m.subDrops, m.serverErrors}
}

// labels returns the label values for a lock's metric: values, then the lock class.
func (m *Metrics) labels(name string, values ...string) []string {
	if m.lockLabel != nil {
		values = append(values, m.lockLabel(name))
	}
	return values
}

// Observer returns the dlock.Observer that feeds these metrics; pass it to dlock.WithObserver
// (of one Client or several).
func (m *Metrics) Observer() dlock.Observer {
	return dlock.Observer{
		AcquireDone: func(_ context.Context, ev dlock.AcquireEvent) {
			path := "none"
			if ev.Outcome == dlock.OutcomeAcquired {
				path = ev.Path.String()
				m.held.WithLabelValues(m.labels(ev.Name)...).Inc()
			}
			m.wait.WithLabelValues(m.labels(ev.Name, ev.Outcome.String(), path)...).Observe(ev.Wait.Seconds())
		},
		Waiting: func(_ context.Context, ev dlock.WaitingEvent) {
			g := m.waiters.WithLabelValues(m.labels(ev.Name)...)
			if ev.Joined {
				g.Inc()
			} else {
				g.Dec()
			}
		},
		Released: func(_ context.Context, ev dlock.ReleaseEvent) {
			l := m.labels(ev.Name)
			m.held.WithLabelValues(l...).Dec()
			m.hold.WithLabelValues(l...).Observe(ev.Held.Seconds())
		},
		Lost: func(_ context.Context, ev dlock.LostEvent) {
			l := m.labels(ev.Name)
			m.held.WithLabelValues(l...).Dec()
			m.hold.WithLabelValues(l...).Observe(ev.Held.Seconds())
			m.lost.WithLabelValues(m.labels(ev.Name, ev.Cause.String())...).Inc()
		},
		Renewal: func(ev dlock.RenewalEvent) {
			m.renewal.Observe(ev.Latency.Seconds())
			if ev.Failed > 0 {
				m.renewalErrors.Inc()
			}
		},
		Subscription: func(ev dlock.SubscriptionEvent) {
			if !ev.Up {
				m.subDrops.Inc()
			}
		},
		NodeError: func(ev dlock.NodeErrorEvent) {
			m.serverErrors.WithLabelValues(ev.Server).Inc()
		},
	}
}
