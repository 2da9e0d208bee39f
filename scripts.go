package dlock

import (
	"embed"

	"github.com/dlock-go/dlock/conn"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

func mustScript(name string) *conn.Script {
	src, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("dlock: missing embedded script " + name) // a build defect, not a runtime condition
	}
	return conn.NewScript(name, string(src))
}

// The scripts every lock uses; docs/PROTOCOL.md describes their keys, arguments and replies.
var (
	scriptAcquire  = mustScript("acquire.lua")
	scriptRelease  = mustScript("release.lua")
	scriptRenew    = mustScript("renew.lua")
	scriptPTTL     = mustScript("pttl.lua")
	scriptHandover = mustScript("handover.lua")
)

// The scripts of the inspection and admin calls (admin.go).
var (
	scriptInspect     = mustScript("inspect.lua")
	scriptForceUnlock = mustScript("forceunlock.lua")
)

// Scripts returns the Lua scripts dlock runs, for inspection and for loading them ahead of time
// (SCRIPT LOAD) on servers that restrict EVAL.
func Scripts() []*conn.Script {
	return []*conn.Script{scriptAcquire, scriptRelease, scriptRenew, scriptPTTL, scriptHandover, scriptInspect, scriptForceUnlock}
}
