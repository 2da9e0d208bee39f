package dlock_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// The whole suite runs as a user with aclRule (main_test.go); this file checks what happens
// without it, and that docs/SECURITY.md shows the rule the suite runs with.

func TestACL_DocumentedRuleIsTheTestedOne(t *testing.T) {
	doc, err := os.ReadFile("docs/SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"ACL SETUSER dlock on >PASSWORD " + strings.Join(aclRule, " "),
		strings.Join(redistest.ACLSentinelExtra, " "), // run with by the adapters' Sentinel tests
		strings.Join(redistest.ACLClusterExtra, " "),  // and Cluster tests
	} {
		if !strings.Contains(string(doc), "\n"+line+"\n") {
			t.Errorf("docs/SECURITY.md does not show the rule the tests run with:\n%s", line)
		}
	}
}

// A user whose keys do not cover the lock's, or who may not run the scripts, gets an error
// that names the NOPERM denial, from Lock and at once.
func TestACL_WithoutTheRuleLockSaysNOPERM(t *testing.T) {
	needShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	users := map[string][]string{
		// Every command, but only the keys and channels of another application.
		"other-keys": {"~app:*", "&app:*", "+@all"},
		// The right keys, but no scripts.
		"no-scripts": {"~dlock:*", "&dlock:*", "+@all", "-evalsha", "-eval"},
	}
	for user, rule := range users {
		if err := shared.SetUser(ctx, user, "pw", rule...); err != nil {
			t.Fatal(err)
		}
	}
	eachTransport(t, func(t *testing.T, tr transport) {
		for user := range users {
			c := tr.dial(t, shared.URLAs(user, "pw"))
			start := time.Now()
			_, err := c.Mutex(uniqueName(t)).Lock(ctxT(t))
			if err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("%s: Lock = %v, want an error naming NOPERM", user, err)
			} else {
				t.Logf("%s: %v", user, err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%s: Lock took %v to fail", user, d)
			}
		}
	})
}

// Without +publish, the scripts that announce a release fail on Redis 7.0 with an ERR that says
// the script's user may not run the command, after writing the released value (Redis does not
// undo a script's earlier writes): Unlock reports the error although the lock is free.
func TestACL_WithoutPublishUnlockFails(t *testing.T) {
	needShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rule []string
	for _, r := range aclRule {
		if r != "+publish" {
			rule = append(rule, r)
		}
	}
	if err := shared.SetUser(ctx, "no-publish", "pw", rule...); err != nil {
		t.Fatal(err)
	}
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URLAs("no-publish", "pw"))
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctxT(t))
		if err != nil {
			t.Fatalf("Lock without +publish: %v", err)
		}
		err = l.Unlock(ctxT(t))
		if err == nil || !strings.Contains(err.Error(), "can't run this command") {
			t.Errorf("Unlock without +publish = %v, want the script's ACL error", err)
		} else {
			t.Logf("Unlock: %v", err)
		}
		if v := redisDo(t, shared, "GET", keyOf(name)); !strings.HasPrefix(v, "- ") {
			t.Errorf("value after the failed Unlock = %q, want the released value", v)
		}
	})
}

// WithPrefix lets applications share a server: a user whose rule names its own prefix locks
// under that prefix, and is refused the default one.
func TestACL_PrefixPerApplication(t *testing.T) {
	needShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rule := make([]string, len(aclRule))
	for i, r := range aclRule {
		rule[i] = strings.ReplaceAll(r, "dlock:", "billing:")
	}
	if err := shared.SetUser(ctx, "billing", "pw", rule...); err != nil {
		t.Fatal(err)
	}
	eachTransport(t, func(t *testing.T, tr transport) {
		c := tr.dial(t, shared.URLAs("billing", "pw"), dlock.WithPrefix("billing:"))
		name := uniqueName(t)
		l, err := c.Mutex(name).Lock(ctxT(t))
		if err != nil {
			t.Fatalf("Lock under the user's own prefix: %v", err)
		}
		if v := redisDo(t, shared, "GET", "billing:{"+name+"}"); v == "" {
			t.Error("no key billing:{name} while locked")
		}
		if err := l.Unlock(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Mutex(name, dlock.WithPrefix(dlock.DefaultPrefix)).Lock(ctxT(t)); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("Lock under dlock: as billing = %v, want NOPERM", err)
		}
	})
}
