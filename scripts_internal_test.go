package dlock

import (
	"slices"
	"testing"

	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// checkCall fails t unless c runs script on keys with args.
func checkCall(t *testing.T, what string, c conn.Call, script *conn.Script, keys, args []string) {
	t.Helper()
	if c.Script != script || !slices.Equal(c.Keys, keys) || !slices.Equal(c.Args, args) {
		name := "<nil>"
		if c.Script != nil {
			name = c.Script.Name
		}
		t.Errorf("%s: %s KEYS %q ARGV %q; want %s KEYS %q ARGV %q", what, name, c.Keys, c.Args, script.Name, keys, args)
	}
}

// The root's Scripts is the protocol's list, in its order (internal/protocol's tests check
// that list against the embedded files).
func TestScripts_AsTheProtocolLists(t *testing.T) {
	if got, want := Scripts(), protocol.Scripts(); !slices.Equal(got, want) {
		t.Errorf("Scripts() = %v; want protocol.Scripts() = %v", got, want)
	}
}
