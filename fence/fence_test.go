package fence

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
)

func TestStatementsPerDialect(t *testing.T) {
	for _, c := range []struct {
		tbl                  Table
		claim, fence, upsert string
	}{
		{
			Table{Dialect: PostgreSQL, Name: "stock", KeyColumn: "sku", FenceColumn: "fence"},
			`UPDATE "stock" SET "fence" = $1 WHERE "sku" = $2 AND "fence" <= $1`,
			`SELECT "fence" FROM "stock" WHERE "sku" = $1`,
			`INSERT INTO "stock" ("sku", "fence", "note", "qty") VALUES ($1, $2, $3, $4) ON CONFLICT ("sku") DO UPDATE SET "note" = excluded."note", "qty" = excluded."qty", "fence" = excluded."fence" WHERE "stock"."fence" <= excluded."fence"`,
		},
		{
			Table{Dialect: SQLite, Name: "main.stock", KeyColumn: "sku"},
			`UPDATE "main"."stock" SET "fence" = ? WHERE "sku" = ? AND "fence" <= ?`,
			`SELECT "fence" FROM "main"."stock" WHERE "sku" = ?`,
			`INSERT INTO "main"."stock" ("sku", "fence", "note", "qty") VALUES (?, ?, ?, ?) ON CONFLICT ("sku") DO UPDATE SET "note" = excluded."note", "qty" = excluded."qty", "fence" = excluded."fence" WHERE "stock"."fence" <= excluded."fence"`,
		},
		{
			Table{Dialect: MySQL, Name: "shop.stock", KeyColumn: "key", FenceColumn: "f"},
			"UPDATE `shop`.`stock` SET `f` = ? WHERE `key` = ? AND `f` <= ?",
			"SELECT `f` FROM `shop`.`stock` WHERE `key` = ? FOR UPDATE",
			"INSERT INTO `shop`.`stock` (`key`, `f`, `note`, `qty`) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE " +
				"`note` = IF(`f` <= VALUES(`f`), VALUES(`note`), `note`), `qty` = IF(`f` <= VALUES(`f`), VALUES(`qty`), `qty`), " +
				"`f` = IF(`f` <= VALUES(`f`), VALUES(`f`), `f`)",
		},
	} {
		t.Run(c.tbl.Dialect.String(), func(t *testing.T) {
			s, err := c.tbl.statements()
			if err != nil {
				t.Fatal(err)
			}
			if s.claim != c.claim {
				t.Errorf("claim:\n got %s\nwant %s", s.claim, c.claim)
			}
			want := strings.Count(c.claim, "?")
			if c.tbl.Dialect == PostgreSQL {
				want = 2 // $1 twice, $2
			}
			if got := len(s.claimArgs(7, "k")); got != want {
				t.Errorf("claim takes %d arguments for %s", got, c.claim)
			}
			if s.fence != c.fence {
				t.Errorf("fence read:\n got %s\nwant %s", s.fence, c.fence)
			}
			up, err := c.tbl.upsertSQL([]string{"note", "qty"})
			if err != nil {
				t.Fatal(err)
			}
			if up != c.upsert {
				t.Errorf("upsert:\n got %s\nwant %s", up, c.upsert)
			}
		})
	}
}

// TestMySQLUpsertAssignsFenceLast: MySQL evaluates ON DUPLICATE KEY UPDATE's assignments in
// order, each seeing the ones before; were the fence assigned first, every later IF would
// compare the new fence with itself and a stale write would go through.
func TestMySQLUpsertAssignsFenceLast(t *testing.T) {
	tbl := Table{Dialect: MySQL, Name: "t", KeyColumn: "k"}
	up, err := tbl.upsertSQL([]string{"a", "zz"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(up, "`fence` = IF(`fence` <= VALUES(`fence`), VALUES(`fence`), `fence`)") ||
		strings.Index(up, "`zz` = IF") > strings.Index(up, "`fence` = IF") {
		t.Fatalf("fence not assigned last: %s", up)
	}
}

func TestInvalidNames(t *testing.T) {
	good := Table{Dialect: PostgreSQL, Name: "stock", KeyColumn: "sku"}
	bad := map[string]Table{}
	for _, name := range []string{"", "1stock", "st ock", `st"ock`, "stock;drop", "a.b.c", ".a", "a.", "st`ock", "ünï",
		strings.Repeat("a", 64)} {
		tb := good
		tb.Name = name
		bad["name "+name] = tb
	}
	for _, col := range []string{"a.b", "x-y", "", "sku'"} {
		tb := good
		tb.KeyColumn = col
		bad["key "+col] = tb
	}
	tb := good
	tb.FenceColumn = "public.fence"
	bad["qualified fence column"] = tb
	tb = good
	tb.FenceColumn = "SKU"
	bad["fence column = key column"] = tb
	tb = good
	tb.Dialect = 0
	bad["no dialect"] = tb

	ctx := context.Background()
	for what, tb := range bad {
		if err := tb.Claim(ctx, nil, "k", 1); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Claim: %v, want ErrInvalid", what, err)
		}
		if err := tb.Upsert(ctx, nil, "k", 1, map[string]any{"qty": 1}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Upsert: %v, want ErrInvalid", what, err)
		}
		if err := InTx(ctx, nil, Held(ctx, 1), tb, []string{"k"}, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: InTx: %v, want ErrInvalid", what, err)
		}
	}
	for _, cols := range []map[string]any{{"q-ty": 1}, {"sku": 1}, {"fence": 1}, {"FENCE": 1}, {"a.b": 1}} {
		if err := good.Upsert(ctx, nil, "k", 1, cols); !errors.Is(err, ErrInvalid) {
			t.Errorf("Upsert of %v: %v, want ErrInvalid", cols, err)
		}
	}
	if err := good.Upsert(ctx, nil, "k", 1, map[string]any{"qty": 1, "QTY": 2}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Upsert of a column twice: %v, want ErrInvalid", err)
	}
	for _, tok := range []uint64{0, 1 << 63} {
		if err := good.Claim(ctx, nil, "k", tok); !errors.Is(err, ErrInvalid) {
			t.Errorf("Claim with token %d: %v, want ErrInvalid", tok, err)
		}
	}
	if !validName("public.stock", true) || !validName("_x9", false) || !validName(strings.Repeat("a", 63), false) {
		t.Error("valid names refused")
	}
}

func TestStaleError(t *testing.T) {
	var err error = &StaleError{Table: "stock", Key: "sku-7", Token: 10, Held: 11}
	if !errors.Is(err, ErrStale) || errors.Is(err, ErrNoRow) {
		t.Fatal("StaleError does not match ErrStale alone")
	}
	msg := err.Error()
	for _, want := range []string{"sku-7", "stock", "token 11", "holder's 10"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message on several lines: %q", msg)
	}
}

func TestInTxLeaseAlreadyEnded(t *testing.T) {
	lctx, cancel := context.WithCancelCause(context.Background())
	lost := errors.New("lock lost")
	cancel(lost)
	tb := Table{Dialect: SQLite, Name: "t", KeyColumn: "k"}
	called := false
	err := InTx(context.Background(), nil, Held(lctx, 3), tb, []int{1}, func(context.Context, *sql.Tx) error { called = true; return nil })
	if !errors.Is(err, ErrLeaseEnded) || !errors.Is(err, lost) || called {
		t.Fatalf("InTx on an ended lease: %v (fn called: %v), want ErrLeaseEnded and the cause, fn not called", err, called)
	}
}

// Update's one statement: the caller's SET, then the fence moved to the token, only where the
// row's fence is not newer; the token's placeholders follow the caller's own.
func TestUpdateStatement(t *testing.T) {
	for _, c := range []struct {
		tbl  Table
		want string
	}{
		{Table{Dialect: PostgreSQL, Name: "stock", KeyColumn: "sku"}, `UPDATE "stock" SET qty = qty - $1, "fence" = $2 WHERE "sku" = $3 AND "fence" <= $2`},
		{Table{Dialect: SQLite, Name: "stock", KeyColumn: "sku"}, `UPDATE "stock" SET qty = qty - ?, "fence" = ? WHERE "sku" = ? AND "fence" <= ?`},
		{Table{Dialect: MySQL, Name: "stock", KeyColumn: "sku", FenceColumn: "f"}, "UPDATE `stock` SET qty = qty - ?, `f` = ? WHERE `sku` = ? AND `f` <= ?"},
	} {
		if got := c.tbl.updateSQL("qty = qty - "+c.tbl.Dialect.ph(1), 1); got != c.want {
			t.Errorf("%v: %s\nwant %s", c.tbl.Dialect, got, c.want)
		}
	}
	if err := (Table{Dialect: SQLite, Name: "stock", KeyColumn: "sku"}).Update(context.Background(), nil, "k", 5, " "); !errors.Is(err, ErrInvalid) {
		t.Errorf("Update with an empty SET = %v, want ErrInvalid", err)
	}
}
