package redistest

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Poll calls check until it returns nil or ctx ends, backing off from 5 ms to
// 100 ms between calls; then it returns ctx's error with check's last
// complaint. Tests use it to wait for a condition they cannot be told about,
// instead of sleeping and hoping; the package waits for its deployments to
// settle with it too. ctx must end: Poll has no bound of its own.
func Poll(ctx context.Context, what string, check func(ctx context.Context) error) error {
	backoff := 5 * time.Millisecond
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("redistest: %s: %w (last: %v)", what, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}

// withDefaultTimeout gives ctx a deadline d from now if it has none.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// infoFields parses the "key:value" lines of an INFO reply.
func infoFields(info string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// records splits a flattened reply of key/value records (SENTINEL REPLICAS,
// rendered by Do as one line per element) into maps; a record starts at each
// key equal to first.
func records(reply, first string) []map[string]string {
	lines := strings.Split(reply, "\n")
	var out []map[string]string
	for i := 0; i+1 < len(lines); i += 2 {
		if lines[i] == first || len(out) == 0 {
			out = append(out, make(map[string]string))
		}
		out[len(out)-1][lines[i]] = lines[i+1]
	}
	return out
}

// role returns the first line of ROLE: "master", "slave" or "sentinel".
func role(ctx context.Context, s *Server) (string, error) {
	r, err := s.Do(ctx, "ROLE")
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(r, "\n")
	return first, nil
}
