package redistest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSlotOf(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	for key, want := range map[string]int{
		"123456789":        12739, // CRC16/XMODEM check value 0x31C3
		"foo":              12182,
		"{user1000}.a":     SlotOf("user1000"),
		"a{}b":             SlotOf("a{}b"),
		"dlock:{orders:1}": SlotOf("orders:1"),
	} {
		if got := SlotOf(key); got != want {
			t.Errorf("SlotOf(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestCluster(t *testing.T) {
	g := NewCluster(t)
	ctx := ctxTimeout(t, 120*time.Second)
	if len(g.Addrs()) != 6 || !strings.HasPrefix(g.URL(), "redis://"+g.Addrs()[0]+"?addr=") {
		t.Fatalf("Addrs %v, URL %s", g.Addrs(), g.URL())
	}
	masters := g.Masters()
	if len(masters) != 3 {
		t.Fatalf("Masters = %d", len(masters))
	}
	for i, m := range masters {
		if r := mustDo(t, m, "ROLE"); !strings.HasPrefix(r, "master") {
			t.Errorf("shard %d master %s has ROLE %q", i, m.Addr, r)
		}
		rep := g.ReplicaOf(m)
		if r := mustDo(t, rep, "ROLE"); !strings.HasPrefix(r, "slave\n127.0.0.1\n"+strconv.Itoa(m.Port)) {
			t.Errorf("shard %d replica %s has ROLE %q", i, rep.Addr, r)
		}
	}
	// SlotOf agrees with the server for a spread of keys.
	for i := range 50 {
		key := "dlock:{name-" + strconv.Itoa(i*7919) + "}"
		if got, want := strconv.Itoa(SlotOf(key)), mustDo(t, masters[0], "CLUSTER", "KEYSLOT", key); got != want {
			t.Errorf("SlotOf(%q) = %s, server says %s", key, got, want)
		}
	}

	// Migrate the slot of a key with a value to another shard.
	key := "dlock:{migrating}"
	slot := SlotOf(key)
	from, err := g.MasterOfSlot(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	mustDo(t, from, "SET", key, "v")
	var to *Server
	for _, m := range masters {
		if m != from {
			to = m
			break
		}
	}
	if err := g.MigrateSlot(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	if got := mustDo(t, to, "GET", key); got != "v" {
		t.Errorf("GET on the new owner = %q", got)
	}
	var re *Error
	if _, err := from.Do(ctx, "GET", key); !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "MOVED "+strconv.Itoa(slot)+" "+to.Addr) {
		t.Errorf("GET on the old owner: %v, want MOVED to %s", err, to.Addr)
	}
	if m, err := g.MasterOfSlot(ctx, slot); err != nil || m != to {
		t.Errorf("MasterOfSlot = %v, %v", m, err)
	}

	// Manual failover of the shard that now holds the key, twice (back and forth).
	shard := -1
	for i, m := range masters {
		if m == to {
			shard = i
		}
	}
	for range 2 {
		start := time.Now()
		old, promoted, err := g.FailoverShard(ctx, shard)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("failover of shard %d: %s -> %s in %v", shard, old.Addr, promoted.Addr, time.Since(start))
		if g.Masters()[shard] != promoted || g.ReplicaOf(promoted) != old {
			t.Fatalf("after failover: Masters %v", g.Masters())
		}
		if got := mustDo(t, promoted, "GET", key); got != "v" {
			t.Errorf("GET on the promoted replica = %q", got)
		}
		if r := mustDo(t, old, "ROLE"); !strings.HasPrefix(r, "slave") {
			t.Errorf("old master ROLE = %q", r)
		}
	}
}
