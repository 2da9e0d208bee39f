package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// server is the HTTP face of one replica.
type server struct {
	locks       *dlock.Client
	store       *store
	log         *slog.Logger
	name        string        // replica name, in logs and /stats
	ttl         time.Duration // lease of the per-SKU lock
	lockWait    time.Duration // how long a purchase waits for the lock before answering 503
	txTimeout   time.Duration // bound on one purchase's transaction
	work        time.Duration // artificial work done while holding the lock, before the transaction (and in a report)
	reportSlots int           // size of the "report" semaphore: reports running at once across every replica
	faults      bool          // POST /admin/fault is enabled
	metrics     http.Handler  // GET /metrics; nil: not served

	stats stats

	faultMu sync.Mutex
	armed   *fault // taken by the next purchase that gets the lock
}

// stats are the replica's counters, served as JSON by GET /stats.
type stats struct {
	Sold          atomic.Int64 // purchases committed (200)
	SoldOut       atomic.Int64 // 409
	LockTimeout   atomic.Int64 // 503: the lock was not had within lockWait
	LeaseLost     atomic.Int64 // 503: the lease ended before the transaction could commit
	FenceRejected atomic.Int64 // 503: the database refused a stale fencing token
	Failed        atomic.Int64 // 503/500: any other failure
	Holding       atomic.Int64 // purchases holding their SKU's lock right now
	ReportBusy    atomic.Int64 // 503: no report slot within lockWait
	InFault       atomic.Int64 // purchases in an injected hold right now
}

// fault is a one-shot injected fault: the next purchase to take a lock holds it for hold before
// touching the database; with detach, its transaction then ignores the lease (as if a pause had
// hit after its last check of the lease), so that only the fence can stop a stale write.
type fault struct {
	hold   time.Duration
	detach bool
}

var (
	errLockWait = errors.New("lock not acquired in time")
	errClient   = errors.New("client went away")
)

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /buy", s.handleBuy)
	mux.HandleFunc("GET /stock/{sku}", s.handleStock)
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.HandleFunc("GET /stats", s.handleStats)
	mux.HandleFunc("GET /report", s.handleReport)
	if s.metrics != nil {
		mux.Handle("GET /metrics", s.metrics)
	}
	mux.HandleFunc("POST /admin/seed", s.handleSeed)
	if s.faults {
		mux.HandleFunc("POST /admin/fault", s.handleFault)
	}
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

type errorBody struct {
	Error   string `json:"error"`
	Reason  string `json:"reason"`
	QtyLeft *int   `json:"qty_left,omitempty"`
}

func fail(w http.ResponseWriter, status int, reason string, err error) {
	writeJSON(w, status, errorBody{Error: err.Error(), Reason: reason})
}

func validSKU(sku string) bool {
	if sku == "" || len(sku) > 64 {
		return false
	}
	for _, c := range []byte(sku) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// BuyResult is the body of a 200 answer to POST /buy.
type BuyResult struct {
	SKU     string `json:"sku"`
	QtyLeft int    `json:"qty_left"`
	Token   uint64 `json:"token"`
}

func (s *server) handleBuy(w http.ResponseWriter, r *http.Request) {
	sku := r.URL.Query().Get("sku")
	qty := 1
	if q := r.URL.Query().Get("qty"); q != "" {
		var err error
		if qty, err = strconv.Atoi(q); err != nil || qty < 1 || qty > 1_000_000 {
			fail(w, http.StatusBadRequest, "bad_request", fmt.Errorf("qty must be an integer in [1, 1000000], not %q", q))
			return
		}
	}
	if !validSKU(sku) {
		fail(w, http.StatusBadRequest, "bad_request", fmt.Errorf("sku must be 1-64 characters of [A-Za-z0-9._-], not %q", sku))
		return
	}

	res, err := s.buy(r.Context(), sku, qty)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, res)
	case errors.Is(err, errSoldOut):
		s.stats.SoldOut.Add(1)
		writeJSON(w, http.StatusConflict, errorBody{Error: "sold out", Reason: "sold_out", QtyLeft: &res.QtyLeft})
	case errors.Is(err, errUnknownSKU):
		s.stats.Failed.Add(1)
		fail(w, http.StatusNotFound, "unknown_sku", err)
	case errors.Is(err, errLockWait):
		s.stats.LockTimeout.Add(1)
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusServiceUnavailable, "lock_timeout", fmt.Errorf("%w (waited %v)", err, s.lockWait))
	case errors.Is(err, errStale):
		s.stats.FenceRejected.Add(1)
		s.log.Warn("stale write rejected by the fence", "sku", sku, "err", err)
		fail(w, http.StatusServiceUnavailable, "stale_fence", err)
	case errors.Is(err, dlock.ErrLost):
		s.stats.LeaseLost.Add(1)
		s.log.Warn("lease lost during purchase: transaction rolled back", "sku", sku, "err", err)
		fail(w, http.StatusServiceUnavailable, "lease_lost", err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, errClient), errors.Is(err, context.Canceled):
		s.stats.Failed.Add(1)
		s.log.Warn("purchase timed out", "sku", sku, "err", err)
		fail(w, http.StatusServiceUnavailable, "timeout", err)
	default:
		s.stats.Failed.Add(1)
		s.log.Error("purchase failed", "sku", sku, "err", err)
		fail(w, http.StatusInternalServerError, "internal", err)
	}
}

// buy is one purchase: lock the SKU, then run the fenced transaction under the lease context.
// A nil error means the sale was committed.
func (s *server) buy(reqCtx context.Context, sku string, qty int) (BuyResult, error) {
	res := BuyResult{SKU: sku}

	// The request's context bounds the wait for the lock and the work under it; WithWait bounds
	// the wait alone: when it runs out with the SKU still held, Do returns an error matching
	// dlock.ErrNotAcquired (naming the holder) and fn does not run.
	entered, committed := false, false
	err := s.locks.Do(reqCtx, "sku:"+sku, func(lctx context.Context) error {
		entered = true
		s.stats.Holding.Add(1)
		defer s.stats.Holding.Add(-1)
		token, ok := dlock.TokenFromContext(lctx)
		if !ok {
			return errors.New("no fencing token in the lock's context")
		}
		res.Token = token

		if s.work > 0 {
			time.Sleep(s.work) // stands for real work under the lock; it does not watch lctx
		}
		txCtx := lctx
		if f := s.takeFault(); f != nil {
			s.stats.InFault.Add(1)
			s.log.Info("injected fault: holding the lock", "sku", sku, "token", token, "hold", f.hold, "detach", f.detach)
			time.Sleep(f.hold)
			s.stats.InFault.Add(-1)
			if f.detach {
				// As if the pause had hit after the last check of the lease: the transaction
				// no longer sees the lease end, and only the fence stands in the way.
				txCtx = context.WithoutCancel(lctx)
			}
		}
		// Err checks the lease deadline itself: a holder resuming from a pause learns here that
		// its lease ran out, even before the renewal loop has run.
		if err := txCtx.Err(); err != nil {
			return fmt.Errorf("before the transaction: %w", context.Cause(txCtx))
		}
		// The transaction lives inside the lock and dies with it (the articles' transaction
		// timeout pitfall, the right way round): a lost lease cancels txCtx, which rolls back.
		txCtx, cancelTx := context.WithTimeout(txCtx, s.txTimeout)
		defer cancelTx()
		left, err := s.store.Buy(txCtx, sku, qty, token)
		res.QtyLeft = left
		if err != nil {
			if txCtx.Err() != nil && lctx.Err() != nil && !errors.Is(err, errStale) {
				// The lease (or the request) ended under the transaction: say which.
				return fmt.Errorf("%w (%w)", err, context.Cause(lctx))
			}
			return err
		}
		committed = true
		return nil
	}, dlock.WithTTL(s.ttl), dlock.WithWait(s.lockWait))

	switch {
	case committed:
		// The sale is in the database. Do may still report an error (the lease ended after the
		// commit, or the release failed); the buyer has the item all the same.
		s.stats.Sold.Add(1)
		if err != nil {
			s.log.Warn("purchase committed; the lock then reported", "sku", sku, "err", err)
		}
		return res, nil
	case !entered && reqCtx.Err() != nil:
		return res, fmt.Errorf("%w: %w", errClient, err) // the request went away (the error may match ErrNotAcquired too)
	case !entered && errors.Is(err, dlock.ErrNotAcquired):
		return res, fmt.Errorf("%w: %w", errLockWait, err) // busy for all of --lock-wait
	}
	return res, err
}

func (s *server) takeFault() *fault {
	if !s.faults {
		return nil
	}
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	f := s.armed
	s.armed = nil
	return f
}

func (s *server) handleFault(w http.ResponseWriter, r *http.Request) {
	hold, err := time.ParseDuration(r.URL.Query().Get("hold"))
	if err != nil || hold < 0 || hold > time.Minute {
		fail(w, http.StatusBadRequest, "bad_request", fmt.Errorf("hold must be a duration up to 1m"))
		return
	}
	f := &fault{hold: hold, detach: r.URL.Query().Get("detach") == "1"}
	s.faultMu.Lock()
	s.armed = f
	s.faultMu.Unlock()
	s.log.Info("fault armed", "hold", hold, "detach", f.detach)
	writeJSON(w, http.StatusOK, map[string]any{"armed": true, "hold": hold.String(), "detach": f.detach})
}

// StockBody is the body of GET /stock/{sku}.
type StockBody struct {
	SKU   string `json:"sku"`
	Qty   int    `json:"qty"`
	Fence int64  `json:"fence"`
}

func (s *server) handleStock(w http.ResponseWriter, r *http.Request) {
	sku := r.PathValue("sku")
	if !validSKU(sku) {
		fail(w, http.StatusBadRequest, "bad_request", fmt.Errorf("bad sku %q", sku))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	qty, fence, err := s.store.Stock(ctx, sku)
	switch {
	case errors.Is(err, errUnknownSKU):
		fail(w, http.StatusNotFound, "unknown_sku", err)
	case err != nil:
		fail(w, http.StatusServiceUnavailable, "db", err)
	default:
		writeJSON(w, http.StatusOK, StockBody{SKU: sku, Qty: qty, Fence: fence})
	}
}

func (s *server) handleSeed(w http.ResponseWriter, r *http.Request) {
	sku := r.URL.Query().Get("sku")
	qty, err := strconv.Atoi(r.URL.Query().Get("qty"))
	if !validSKU(sku) || err != nil || qty < 0 {
		fail(w, http.StatusBadRequest, "bad_request", fmt.Errorf("want sku=S&qty=N with N >= 0"))
		return
	}
	if err := s.seed(r.Context(), sku, qty); err != nil {
		fail(w, http.StatusServiceUnavailable, "seed", err)
		return
	}
	writeJSON(w, http.StatusOK, StockBody{SKU: sku, Qty: qty})
}

// seed sets a SKU's stock under its lock, fenced like a purchase.
func (s *server) seed(ctx context.Context, sku string, qty int) error {
	ctx, cancel := context.WithTimeout(ctx, s.lockWait+s.txTimeout)
	defer cancel()
	return s.locks.Do(ctx, "sku:"+sku, func(lctx context.Context) error {
		token, _ := dlock.TokenFromContext(lctx)
		return s.store.Seed(lctx, sku, qty, token)
	}, dlock.WithTTL(s.ttl))
}

func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.db.PingContext(ctx); err != nil {
		fail(w, http.StatusServiceUnavailable, "db", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "replica": s.name, "db": s.store.kind})
}

// StatsBody is the body of GET /stats.
type StatsBody struct {
	Replica       string `json:"replica"`
	Sold          int64  `json:"sold"`
	SoldOut       int64  `json:"sold_out"`
	LockTimeout   int64  `json:"lock_timeout"`
	LeaseLost     int64  `json:"lease_lost"`
	FenceRejected int64  `json:"fence_rejected"`
	Failed        int64  `json:"failed"`
	Holding       int64  `json:"holding"`
	ReportBusy    int64  `json:"report_busy"`
	InFault       int64  `json:"in_fault"`
}

func (s *server) snapshot() StatsBody {
	return StatsBody{
		Replica:       s.name,
		Sold:          s.stats.Sold.Load(),
		SoldOut:       s.stats.SoldOut.Load(),
		LockTimeout:   s.stats.LockTimeout.Load(),
		LeaseLost:     s.stats.LeaseLost.Load(),
		FenceRejected: s.stats.FenceRejected.Load(),
		Failed:        s.stats.Failed.Load(),
		Holding:       s.stats.Holding.Load(),
		ReportBusy:    s.stats.ReportBusy.Load(),
		InFault:       s.stats.InFault.Load(),
	}
}

func (s *server) handleStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.snapshot())
}

// ReportBody is the body of a 200 answer to GET /report.
type ReportBody struct {
	Stock []StockRow `json:"stock"`
	// Token is the fencing token of the report slot (the semaphore lease): unique, and larger
	// than every earlier slot's.
	Token uint64 `json:"token"`
	// SlotFrom and SlotUntil are when this replica held the slot (from the acquisition to the
	// end of the query), for logs and the tests.
	SlotFrom  time.Time `json:"slot_from"`
	SlotUntil time.Time `json:"slot_until"`
}

// handleReport serves the stock of every SKU. A whole-table read is the expensive kind of
// request: at most reportSlots of them run at once across every replica, under a dlock
// semaphore ("report"), so a burst of reports cannot crowd purchases out of the database. A
// report waits at most lockWait for a slot, else 503 report_busy. Every replica must declare
// the same size (--report-slots); one that declares another gets an error naming the stored
// size (dlock.ErrInvalid), until the semaphore is resized (dlock resize report N).
func (s *server) handleReport(w http.ResponseWriter, r *http.Request) {
	var body ReportBody
	err := s.locks.DoAcquire(r.Context(), "report", s.reportSlots, 1, func(ctx context.Context) error {
		body.SlotFrom = time.Now()
		body.Token, _ = dlock.TokenFromContext(ctx)
		if s.work > 0 {
			time.Sleep(s.work) // stands for a slow query
		}
		qctx, cancel := context.WithTimeout(ctx, s.txTimeout)
		defer cancel()
		var err error
		body.Stock, err = s.store.Report(qctx)
		body.SlotUntil = time.Now()
		return err
	}, dlock.WithWait(s.lockWait))
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, body)
	case errors.Is(err, dlock.ErrNotAcquired):
		s.stats.ReportBusy.Add(1)
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusServiceUnavailable, "report_busy", err)
	default:
		s.log.Error("report failed", "err", err)
		fail(w, http.StatusInternalServerError, "internal", err)
	}
}
