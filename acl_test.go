package dlock_test

import (
	"context"
	"errors"
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

// A user whose keys do not cover the lock's, who may not run the scripts, or who lacks a
// command the scripts call (here PUBLISH, without which a release would write and then fail
// to announce itself) is refused at Dial and New, with ErrDenied naming the NOPERM denial or
// the missing command.
func TestACL_WithoutTheRuleDialSaysWhat(t *testing.T) {
	needShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var noPublish []string
	for _, r := range aclRule {
		if r != "+publish" {
			noPublish = append(noPublish, r)
		}
	}
	users := map[string][]string{
		// Every command, but only the keys and channels of another application.
		"other-keys": {"~app:*", "&app:*", "+@all"},
		// The right keys, but no scripts.
		"no-scripts": {"~dlock:*", "&dlock:*", "+@all", "-evalsha", "-eval"},
		"no-publish": noPublish,
	}
	want := map[string]string{"other-keys": "NOPERM", "no-scripts": "NOPERM", "no-publish": "+publish"}
	for user, rule := range users {
		if err := shared.SetUser(ctx, user, "pw", rule...); err != nil {
			t.Fatal(err)
		}
	}
	eachTransport(t, func(t *testing.T, tr transport) {
		for user := range users {
			_, err := dialErr(t, tr.name, shared.URLAs(user, "pw"))
			if !errors.Is(err, dlock.ErrDenied) || !strings.Contains(err.Error(), want[user]) {
				t.Errorf("%s: Dial = %v, want ErrDenied naming %s", user, err, want[user])
			} else {
				t.Logf("%s: %v", user, err)
			}
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
		switch c2, err := dialErr(t, tr.name, shared.URLAs("billing", "pw")); {
		case err == nil:
			c2.Close()
			t.Error("Dial as billing under the default prefix succeeded, want ErrDenied")
		case !errors.Is(err, dlock.ErrDenied):
			t.Errorf("Dial as billing under the default prefix = %v, want ErrDenied", err)
		}
	})
}

// Without +subscribe a waiting Lock cannot be woken: it fails with ErrDenied naming the rule
// (at its first subscription), instead of waiting out every holder's lease.
func TestACL_WithoutSubscribeLockSaysSo(t *testing.T) {
	needShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rule []string
	for _, r := range aclRule {
		if r != "+subscribe" {
			rule = append(rule, r)
		}
	}
	if err := shared.SetUser(ctx, "no-subscribe", "pw", rule...); err != nil {
		t.Fatal(err)
	}
	eachTransport(t, func(t *testing.T, tr transport) {
		holder := tr.dial(t, shared.URL())
		name := uniqueName(t)
		l, err := holder.Mutex(name, dlock.WithTTL(30*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		c := tr.dial(t, shared.URLAs("no-subscribe", "pw"))
		start := time.Now()
		_, err = c.Mutex(name).Lock(ctx)
		if !errors.Is(err, dlock.ErrDenied) || !strings.Contains(err.Error(), "+subscribe") {
			t.Fatalf("Lock without +subscribe = %v, want ErrDenied naming +subscribe", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("it took %v to fail (the holder's lease is 30 s)", took)
		}
	})
}
