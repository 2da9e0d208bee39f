// Package protocol holds the pure parts of dlock's wire protocol (see docs/PROTOCOL.md): the
// keys and channels of a lock (keys.go), the Lua scripts and their assembly from the script
// library (scripts.go, scripts/), each script's call and the reading of its reply (calls.go,
// calls_shared.go), and how announcements on the release and client channels read
// (announce.go). Nothing here talks to Redis; its tests need no server.
package protocol

import (
	"strconv"
	"strings"
	"time"
)

// Grant is one grant an announcement carries: the lock (or a shared lock's units) now belongs
// to the owner of the queue entry ID, with Token, for Window (the grant's first lease, which the
// grantee's client renews) unless renewed.
type Grant struct {
	ID     string
	Token  uint64
	Window time.Duration
}

// ParseGrants reads a grant announcement and appends its grants to dst. Two forms exist:
// "G <id> <token> <window ms> …" (one or more grants, as shared.lua writes them) and the
// single grant "g <token> <id> <window ms>" (acquire.lua, release.lua and the multi-lock
// scripts). ok is false when payload is not a grant announcement; a grant whose fields do not
// read is skipped (in the single form the whole announcement is then not ok).
func ParseGrants(payload string, dst []Grant) (grants []Grant, ok bool) {
	if rest, found := strings.CutPrefix(payload, "g "); found {
		tok, rest, _ := strings.Cut(rest, " ")
		id, win, _ := strings.Cut(rest, " ")
		token, err := strconv.ParseUint(tok, 10, 64)
		if err != nil {
			return dst, false
		}
		w, _ := strconv.ParseInt(win, 10, 64)
		return append(dst, Grant{ID: id, Token: token, Window: time.Duration(w) * time.Millisecond}), true
	}
	rest, found := strings.CutPrefix(payload, "G ")
	if !found {
		return dst, false
	}
	f := strings.Fields(rest)
	for i := 0; i+2 < len(f); i += 3 {
		token, err1 := strconv.ParseUint(f[i+1], 10, 64)
		w, err2 := strconv.ParseInt(f[i+2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		dst = append(dst, Grant{ID: f[i], Token: token, Window: time.Duration(w) * time.Millisecond})
	}
	return dst, true
}

// AnyToken is the token ParseRelease gives a release announcement whose token does not read:
// above every real token, so that it wakes whoever waits.
const AnyToken = ^uint64(0)

// ParseRelease reads a release announcement that granted nothing: "<token>", the released
// holder's token (AnyToken when it does not read as one).
func ParseRelease(payload string) uint64 {
	token, err := strconv.ParseUint(payload, 10, 64)
	if err != nil {
		return AnyToken
	}
	return token
}

// LeaderNotice is what proclaim.lua announces on a lock's release channel when an election's
// leader takes office or changes its advertised value: "l <token>". Only an election's
// observers act on it (they read the lock again); a waiting client ignores it.
func LeaderNotice(token uint64) string { return "l " + strconv.FormatUint(token, 10) }

// IsLeaderNotice reports whether payload is a LeaderNotice.
func IsLeaderNotice(payload string) bool { return strings.HasPrefix(payload, "l ") }
