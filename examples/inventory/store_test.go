//go:build linux

package main

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestStoreFence checks the fenced transaction on its own, on each database: a smaller token
// than the row's fence neither reads nor writes, whatever it asks.
func TestStoreFence(t *testing.T) {
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			dsn := filepath.Join(t.TempDir(), "fence.db")
			if kind == "postgres" {
				dsn = postgresURL(t, "fence_unit")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, err := openStore(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.kind != kind {
				t.Fatalf("opened %s, want %s", s.kind, kind)
			}

			if err := s.Seed(ctx, "w", 5, 10); err != nil {
				t.Fatal(err)
			}
			if err := s.Seed(ctx, "w", 99, 9); !errors.Is(err, errStale) {
				t.Fatalf("seed with an older token: %v, want errStale", err)
			}
			if left, err := s.Buy(ctx, "w", 1, 20); err != nil || left != 4 {
				t.Fatalf("buy with token 20: left %d, %v; want 4, nil", left, err)
			}
			if left, err := s.Buy(ctx, "w", 1, 20); err != nil || left != 3 {
				t.Fatalf("second buy by the same lease (token 20): left %d, %v; want 3, nil", left, err)
			}
			if _, err := s.Buy(ctx, "w", 1, 15); !errors.Is(err, errStale) {
				t.Fatalf("buy with stale token 15: %v, want errStale", err)
			}
			if left, err := s.Buy(ctx, "w", 10, 30); !errors.Is(err, errSoldOut) || left != 3 {
				t.Fatalf("buy 10 of 3: left %d, %v; want 3, errSoldOut", left, err)
			}
			// The sold-out answer still moved the fence: 25 is now stale.
			if _, err := s.Buy(ctx, "w", 1, 25); !errors.Is(err, errStale) {
				t.Fatalf("buy with token 25 after 30: %v, want errStale", err)
			}
			if _, err := s.Buy(ctx, "nope", 1, 40); !errors.Is(err, errUnknownSKU) {
				t.Fatalf("buy of an unknown sku: %v, want errUnknownSKU", err)
			}
			qty, fence, err := s.Stock(ctx, "w")
			if err != nil || qty != 3 || fence != 30 {
				t.Fatalf("stock: qty %d fence %d %v; want 3, 30", qty, fence, err)
			}
			if _, err := s.Buy(ctx, "w", 1, 0); err == nil {
				t.Fatal("token 0 accepted")
			}
		})
	}
}
