// Package redact hides passwords in what dlock prints: a Redis URL's user info keeps its user
// name, and its password becomes "xxxxx". Every message that may hold a URL goes through it.
package redact

import "strings"

// Mask replaces a password.
const Mask = "xxxxx"

// URL returns s with the password of its user info, if any, replaced by Mask. It accepts the
// forms dlock takes (redis://, rediss://, redis+sentinel:// with several hosts, unix://) and a
// bare "[user:password@]host:port".
func URL(s string) string {
	rest := s
	scheme := ""
	if i := strings.Index(s, "://"); i >= 0 {
		scheme, rest = s[:i+3], s[i+3:]
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return s
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return s
	}
	return scheme + user + ":" + Mask + rest[at:]
}

// Text returns msg with every occurrence of password replaced by Mask (for messages that may
// quote a URL or a command line).
func Text(msg, password string) string {
	if password == "" {
		return msg
	}
	return strings.ReplaceAll(msg, password, Mask)
}
