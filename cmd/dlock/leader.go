package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
)

const leaderUsage = `
Show who leads the election NAME ("dlock elect", dlock.Client.Election): the value the leader
advertises, its term (the fencing token of the term: larger at every new term), the leading
process (host, pid, process start, label) and since when it leads (the server's clock).
A holder of the lock NAME that is not an election's leader ("dlock run NAME") shows as a
leader with an empty value.

With --watch it prints the leader, then a line at each change (a new term, a new value,
nobody leading), until interrupted (SIGINT, SIGTERM: exit 0). It follows the election's
announcements, not by polling (it reads the lock once at each, and once more when the lease
it saw would have run out, which is how a crashed leader with no successor shows); a reader
that falls behind sees the latest state, not every step.

Exit codes: 0 a leader was shown (with --watch: interrupted); 1 nobody leads (nothing else
is wrong); 2 bad command line or --redis URL; 69 the server cannot be reached (or used);
77 access denied: the server refused the login or a command to the user (see "The minimal
ACL rule" in docs/SECURITY.md).

Text output: the value is always Go-quoted (strconv.Quote); the name, host and label as
"dlock status" prints them. With --watch each line starts with the time this host saw the
change (RFC 3339, UTC).

JSON fields (--json; with --watch one object per line, compact):
  name, name_b64     the election's name, and its exact bytes in standard base64 (as in
                     "dlock list --json": a name that is not valid UTF-8 shows U+FFFD in name)
  value, value_b64   the leader's value, and its exact bytes in standard base64
  term               the term's fencing token; 0 when nobody leads, and then value,
                     value_b64, holder and since are omitted
  holder             {"host", "pid", "start" (the leading process's start, RFC 3339),
                     "label" (omitted when empty)}
  since              when the term began (RFC 3339, UTC, server clock)
  seen               with --watch: when this host saw the change (RFC 3339, UTC)

Examples:
  dlock leader scheduler
  dlock leader --json scheduler
  dlock leader --watch scheduler
  dlock leader --b64 //4geCA=                 (the name of bytes ff fe, then " x ")`

func runLeader(ctx context.Context, std *stdio, args []string) int {
	fs := newFlagSetSynopsis("leader", "[flags] NAME", leaderUsage)
	var sf serverFlags
	sf.add(fs)
	asJSON := fs.Bool("json", false, "print JSON (fields below)")
	watch := fs.Bool("watch", false, "print the leader, then a line at each change, until interrupted")
	b64 := addB64Flag(fs)
	name, done, code := parseOneName(fs, std, args, b64)
	if done {
		return code
	}
	c, code := sf.dial(ctx, std, "leader")
	if c == nil {
		return code
	}
	defer c.Close()
	e := c.Election(name)
	info, err := e.Leader(ctx)
	if err != nil && !errors.Is(err, dlock.ErrNoLeader) {
		return report(std, "leader", err)
	}
	if !*watch {
		if *asJSON {
			if code := printJSON(std, "leader", leaderJSON(name, info)); code != exitOK {
				return code
			}
		} else {
			printLeader(std.out, name, info)
		}
		if info.Term == 0 {
			return exitFailure
		}
		return exitOK
	}

	// Observe sends the leader as it is first (the one read above was only to report the
	// errors a watch does not), then each change.
	for info := range e.Observe(ctx) {
		seen := time.Now().UTC().Format(time.RFC3339Nano)
		if *asJSON {
			j := leaderJSON(name, info)
			j.Seen = seen
			b, _ := json.Marshal(j)
			fmt.Fprintf(std.out, "%s\n", b)
		} else {
			fmt.Fprintf(std.out, "%s %s\n", seen, leaderLine(info))
		}
	}
	if ctx.Err() != nil {
		return exitOK
	}
	fail(std, "leader", fmt.Errorf("%w: the watch of %q ended: the client closed", dlock.ErrClosed, name))
	return exitFailure
}

// jsonLeader is the JSON of an election's leader, in "dlock leader --json" and (without name,
// name_b64 and holder, which the lock's own fields give) as "leader" in "dlock list --json".
type jsonLeader struct {
	Name     string      `json:"name,omitempty"`
	NameB64  string      `json:"name_b64,omitempty"`
	Value    *string     `json:"value,omitempty"` // nil: nobody leads
	ValueB64 *string     `json:"value_b64,omitempty"`
	Term     uint64      `json:"term"`
	Holder   *jsonHolder `json:"holder,omitempty"`
	Since    string      `json:"since,omitempty"`
	Seen     string      `json:"seen,omitempty"`
}

func leaderJSON(name string, info dlock.LeaderInfo) jsonLeader {
	j := jsonLeader{Name: name, NameB64: b64Name(name)}
	if info.Term == 0 {
		return j
	}
	j.Term = info.Term
	j.Value, j.ValueB64 = ptr(info.Value), ptr(b64Name(info.Value))
	j.Holder = &jsonHolder{Host: info.Holder.Host, PID: info.Holder.PID, Label: info.Holder.Label}
	if !info.Holder.Start.IsZero() {
		j.Holder.Start = info.Holder.Start.UTC().Format(time.RFC3339)
	}
	if !info.Since.IsZero() {
		j.Since = info.Since.UTC().Format(time.RFC3339Nano)
	}
	return j
}

// lockLeaderJSON is the "leader" field of a lock in "dlock list --json": nil unless an
// election's leader holds it.
func lockLeaderJSON(l *dlock.LeaderInfo) *jsonLeader {
	if l == nil {
		return nil
	}
	j := leaderJSON("", *l)
	j.Name, j.NameB64, j.Holder = "", "", nil
	return &j
}

func ptr[T any](v T) *T { return &v }

// printLeader prints the leader of name as "dlock status" prints a lock.
func printLeader(w io.Writer, name string, info dlock.LeaderInfo) {
	if info.Term == 0 {
		fmt.Fprintf(w, "%s: no leader\n", display(name))
		return
	}
	fmt.Fprintf(w, "%s: led by %s\n", display(name), strconv.Quote(info.Value))
	fmt.Fprintf(w, "  term:    %d\n", info.Term)
	fmt.Fprintf(w, "  holder:  %s\n", holderText(info.Holder))
	fmt.Fprintf(w, "  since:   %s (server clock)\n", info.Since.UTC().Format(time.RFC3339Nano))
}

// leaderLine is the leader on one line, for --watch.
func leaderLine(info dlock.LeaderInfo) string {
	if info.Term == 0 {
		return "no leader"
	}
	return fmt.Sprintf("led by %s: term %d, %s, since %s", strconv.Quote(info.Value), info.Term, holderText(info.Holder),
		info.Since.UTC().Format(time.RFC3339Nano))
}
