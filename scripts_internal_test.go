package dlock

import (
	"slices"
	"testing"

	"github.com/dlock-go/dlock/internal/protocol"
)

// The root's Scripts is the protocol's list, in its order (internal/protocol's tests check
// that list against the embedded files).
func TestScripts_AsTheProtocolLists(t *testing.T) {
	if got, want := Scripts(), protocol.Scripts(); !slices.Equal(got, want) {
		t.Errorf("Scripts() = %v; want protocol.Scripts() = %v", got, want)
	}
}
