package redistest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSetUser(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := ctxTimeout(t, 10*time.Second)
	if err := s.SetUser(ctx, "app", "secret", "~app:*", "+get", "+set"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.DoAs(ctx, "app", "secret", "SET", "app:1", "x"); err != nil || got != "OK" {
		t.Errorf("SET app:1 as app = %q, %v", got, err)
	}
	var re *Error
	if _, err := s.DoAs(ctx, "app", "secret", "SET", "other", "x"); !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "NOPERM") {
		t.Errorf("SET other as app: %v, want NOPERM", err)
	}
	if _, err := s.DoAs(ctx, "app", "secret", "DEL", "app:1"); !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "NOPERM") {
		t.Errorf("DEL as app: %v, want NOPERM", err)
	}
	if _, err := s.DoAs(ctx, "app", "wrong", "PING"); err == nil {
		t.Error("AUTH with a wrong password succeeded")
	}
	s.SetURLUser("app", "p@ss")
	if want := "redis://app:p%40ss@127.0.0.1:" + strconv.Itoa(s.Port) + "/0"; s.URL() != want {
		t.Errorf("URL = %q, want %q", s.URL(), want)
	}
	// Do stays the default user.
	if got := mustDo(t, s, "DEL", "app:1"); got != "1" {
		t.Errorf("DEL as default = %q", got)
	}
}
