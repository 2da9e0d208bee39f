package dlockprom_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockprom"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// class is the tests' lock-name mapping: "sku:42" -> "sku".
func class(name string) string {
	c, _, _ := strings.Cut(name, ":")
	return c
}

// value returns, from what reg gathers, the value of the series of metric name with exactly
// labels: a counter's or gauge's value, a histogram's sample count; -1 when there is no such
// series.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; !ok || v != lp.GetValue() {
					continue series
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// eventually polls until value(name, labels) satisfies ok, for up to 10 s.
func eventually(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, what string, ok func(float64) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := redistest.Poll(ctx, name+" "+what, func(context.Context) error {
		if v := value(t, reg, name, labels); !ok(v) {
			return fmt.Errorf("value %v", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func dial(t *testing.T, url string, opts ...dlock.ClientOption) *dlock.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dlock.Dial(ctx, url, append(opts, dlock.WithLogger(slog.New(slog.DiscardHandler)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The metrics of a real client, read back from a real registry: waits by outcome and path,
// holds, leases held, waiting goroutines, losses by cause, renewal rounds and their errors,
// every series labelled with the lock class, and the whole set passing the registry's lint.
func TestMetrics(t *testing.T) {
	s := redistest.Start(t)
	reg := prometheus.NewRegistry()
	m, err := dlockprom.New(reg, dlockprom.WithLockLabel(class))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dial(t, s.URL(), dlock.WithObserver(m.Observer()), dlock.WithTTL(300*time.Millisecond))
	other := dial(t, s.URL())
	sku := map[string]string{"lock": "sku"}

	// One acquisition from the server, held, then released.
	l, err := c.Mutex("sku:1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, reg, "dlock_leases_held", sku); v != 1 {
		t.Fatalf("dlock_leases_held while held = %v, want 1", v)
	}
	// Held long enough for the renewal loop to renew it (every 100 ms).
	eventually(t, reg, "dlock_renewal_seconds", nil, "counts a round", func(v float64) bool { return v >= 1 })
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if v := value(t, reg, "dlock_acquire_wait_seconds", map[string]string{"outcome": "acquired", "path": "server", "lock": "sku"}); v != 1 {
		t.Fatalf("acquired from the server: %v, want 1", v)
	}
	if v := value(t, reg, "dlock_hold_seconds", sku); v != 1 {
		t.Fatalf("holds: %v, want 1", v)
	}
	if v := value(t, reg, "dlock_leases_held", sku); v != 0 {
		t.Fatalf("dlock_leases_held after Unlock = %v, want 0", v)
	}

	// A waiting goroutine, then a local handoff to it.
	l, err = c.Mutex("sku:2").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := c.Mutex("sku:2").Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	eventually(t, reg, "dlock_waiters", sku, "is 1", func(v float64) bool { return v == 1 })
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if v := value(t, reg, "dlock_waiters", sku); v != 0 {
		t.Fatalf("dlock_waiters after the wait = %v, want 0", v)
	}
	if v := value(t, reg, "dlock_acquire_wait_seconds", map[string]string{"outcome": "acquired", "path": "local", "lock": "sku"}); v != 1 {
		t.Fatalf("acquired by a local handoff: %v, want 1", v)
	}

	// Busy, and timed out, while another client holds it.
	ol, err := other.Mutex("cart:9").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("cart:9").TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	if _, err := c.Mutex("cart:9", dlock.WithWait(20*time.Millisecond)).Lock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	ol.Unlock(ctx)
	for _, outcome := range []string{"busy", "timed_out"} {
		if v := value(t, reg, "dlock_acquire_wait_seconds", map[string]string{"outcome": outcome, "path": "none", "lock": "cart"}); v != 1 {
			t.Fatalf("%s: %v, want 1", outcome, v)
		}
	}

	// A lease lost to a force unlock.
	l, err = c.Mutex("sku:3").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ForceUnlock(ctx, "sku:3"); err != nil {
		t.Fatal(err)
	}
	eventually(t, reg, "dlock_leases_lost_total", map[string]string{"cause": "force_unlocked", "lock": "sku"}, "is 1", func(v float64) bool { return v == 1 })
	l.Unlock(ctx)
	if v := value(t, reg, "dlock_leases_held", sku); v != 0 {
		t.Fatalf("dlock_leases_held after the loss = %v, want 0", v)
	}

	// Renewal rounds that cannot reach the server.
	p := redistest.NewProxy(t, s.Addr)
	cut := dial(t, p.URL(), dlock.WithObserver(m.Observer()), dlock.WithTTL(600*time.Millisecond))
	if _, err := cut.Mutex("job:nightly").Lock(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close()
	eventually(t, reg, "dlock_renewal_errors_total", nil, "counts a failed round", func(v float64) bool { return v >= 1 })
	eventually(t, reg, "dlock_leases_lost_total", map[string]string{"cause": "deadline", "lock": "job"}, "is 1", func(v float64) bool { return v == 1 })

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// The exposition of the gauges, as a scraper sees it.
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP dlock_leases_held Leases held now.
# TYPE dlock_leases_held gauge
dlock_leases_held{lock="job"} 0
dlock_leases_held{lock="sku"} 0
# HELP dlock_waiters Goroutines waiting for a lock now.
# TYPE dlock_waiters gauge
dlock_waiters{lock="cart"} 0
dlock_waiters{lock="sku"} 0
`), "dlock_leases_held", "dlock_waiters")
	if err != nil {
		t.Fatal(err)
	}
}

// Without WithLockLabel, no series carries a lock label: names never become label values.
func TestMetrics_NoLockLabelByDefault(t *testing.T) {
	s := redistest.Start(t)
	reg := prometheus.NewRegistry()
	m, err := dlockprom.New(reg, dlockprom.WithConstLabels(prometheus.Labels{"deployment": "orders"}))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, s.URL(), dlock.WithObserver(m.Observer()))
	ctx := context.Background()
	for i := range 3 {
		if err := c.Do(ctx, fmt.Sprintf("order:%d", i), func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if v := value(t, reg, "dlock_acquire_wait_seconds", map[string]string{"outcome": "acquired", "path": "server", "deployment": "orders"}); v != 3 {
		t.Fatalf("acquisitions: %v, want 3 in one series", v)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "lock" || strings.Contains(lp.GetValue(), "order:") {
					t.Errorf("%s has label %s=%q", mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
	// A second Metrics on the same registry is refused, and leaves nothing half-registered.
	if _, err := dlockprom.New(reg); err == nil {
		t.Fatal("a second New on the same registry succeeded")
	}
	if _, err := dlockprom.New(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
}
