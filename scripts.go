package dlock

import (
	"github.com/dlock-go/dlock/conn"
	"github.com/dlock-go/dlock/internal/protocol"
)

// Scripts returns the Lua scripts dlock runs, for inspection and for loading them ahead of time
// (SCRIPT LOAD) on servers that restrict EVAL.
func Scripts() []*conn.Script { return protocol.Scripts() }
