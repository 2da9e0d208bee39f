// Command inventory is the articles' stock-deduction service done right: an HTTP service that
// several replicas run at once, deducting stock held in one SQL row under a dlock lock per SKU,
// with every read and write of the row fenced by the lock's token.
//
//	POST /buy?sku=S&qty=N   200 {sku, qty_left, token}; 409 sold out; 503 lock not had in time,
//	                        lease lost, or stale token refused by the database
//	GET  /stock/S           the committed stock and fence of S
//	GET  /healthz           200 when the database answers
//	GET  /stats             this replica's counters (sold, sold_out, lock_timeout, lease_lost,
//	                        fence_rejected, ...)
//	GET  /metrics           Prometheus metrics: the locks' (dlockprom), with the lock class
//	                        "sku" as label, and the Go runtime's
//	POST /admin/seed?sku=S&qty=N   set the stock of S (under its lock)
//
// See README.md for running three replicas and the load generator (cmd/loadgen) by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockprom"
)

type seedList []string

func (l *seedList) String() string { return strings.Join(*l, ",") }
func (l *seedList) Set(v string) error {
	sku, n, ok := strings.Cut(v, "=")
	if q, err := strconv.Atoi(n); !ok || err != nil || q < 0 || !validSKU(sku) {
		return fmt.Errorf("want sku=N, not %q", v)
	}
	*l = append(*l, v)
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

func run() error {
	var seeds seedList
	addr := flag.String("addr", "127.0.0.1:8080", "listen address (port 0 picks a free port; the address is printed)")
	redisURL := flag.String("redis", envOr("REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL for the locks (env REDIS_URL)")
	dbURL := flag.String("db", envOr("DATABASE_URL", "inventory.db"), "postgres://… URL, or the path of an SQLite file (env DATABASE_URL)")
	name := flag.String("name", "", "replica name for logs and /stats (default: the listen address)")
	ttl := flag.Duration("ttl", 10*time.Second, "lease of the per-SKU lock (renewed every ttl/3 while held)")
	lockWait := flag.Duration("lock-wait", 2*time.Second, "how long a purchase waits for its SKU's lock before answering 503")
	txTimeout := flag.Duration("tx-timeout", 5*time.Second, "bound on one purchase's database transaction")
	work := flag.Duration("work", 0, "artificial work per purchase (and report) while holding the lock (for demos)")
	reportSlots := flag.Int("report-slots", 2, "GET /report: how many reports may run at once across every replica (a dlock semaphore; every replica must give the same number)")
	faults := flag.Bool("fault-injection", false, "enable POST /admin/fault?hold=D[&detach=1] (tests)")
	flag.Var(&seeds, "seed-stock", "sku=N: create the SKU with N items at start unless it exists (repeatable)")
	flag.Parse()
	if *reportSlots < 1 || *reportSlots > dlock.MaxSemaphoreSize {
		return fmt.Errorf("--report-slots %d: want 1 to %d", *reportSlots, dlock.MaxSemaphoreSize)
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	if *name == "" {
		*name = ln.Addr().String()
	}
	log = log.With("replica", *name)

	startCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	st, err := openStore(startCtx, *dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	// The locks' metrics, by lock class: every lock of this service is "sku:<SKU>", of class
	// "sku" (never the SKU itself: one time series per SKU would grow without bound), or the
	// "report" semaphore.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	lockMetrics, err := dlockprom.New(reg, dlockprom.WithLockLabel(lockClass))
	if err != nil {
		return err
	}
	locks, err := dlock.Dial(startCtx, *redisURL, dlock.WithTTL(*ttl), dlock.WithLabel("inventory "+*name),
		dlock.WithObserver(lockMetrics.Observer()), dlock.WithLogger(log))
	if err != nil {
		return err
	}
	defer locks.Close()
	for _, sd := range seeds {
		sku, n, _ := strings.Cut(sd, "=")
		q, _ := strconv.Atoi(n)
		created, err := st.SeedIfAbsent(startCtx, sku, q)
		if err != nil {
			return err
		}
		log.Info("seed", "sku", sku, "qty", q, "created", created)
	}

	srv := &server{
		locks: locks, store: st, log: log, name: *name,
		ttl: *ttl, lockWait: *lockWait, txTimeout: *txTimeout, work: *work, faults: *faults, reportSlots: *reportSlots,
		metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}
	hs := &http.Server{
		Handler:           srv.routes(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      *lockWait + *txTimeout + *work + 10*time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	fmt.Printf("inventory: listening on http://%s (db %s)\n", ln.Addr(), st.kind)
	log.Info("serving", "addr", ln.Addr().String(), "db", st.kind, "ttl", *ttl, "lock_wait", *lockWait)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Graceful shutdown, in this order: stop accepting and drain the requests in flight
	// (Shutdown waits for their handlers to return), then close the lock client. Closed first,
	// the client would end the lease of every purchase under way (its context cancelled with
	// cause dlock.ErrClosed, its transaction rolled back) and fail the purchases waiting for a
	// lock with dlock.ErrClosed.
	log.Info("shutting down: draining requests")
	shutCtx, cancelShut := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancelShut()
	if err := hs.Shutdown(shutCtx); err != nil {
		log.Warn("shutdown", "err", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("requests drained; closing the lock client")
	if err := locks.Close(); err != nil { // releases what it still holds; the deferred Close is then a no-op
		log.Warn("closing the lock client", "err", err)
	}
	s := srv.snapshot()
	log.Info("stopped", "sold", s.Sold, "sold_out", s.SoldOut, "lock_timeout", s.LockTimeout,
		"lease_lost", s.LeaseLost, "fence_rejected", s.FenceRejected, "failed", s.Failed)
	return nil
}

// lockClass is the metrics label of a lock name: the part before the first ':' ("sku:widget"
// is "sku").
func lockClass(name string) string {
	class, _, _ := strings.Cut(name, ":")
	return class
}
