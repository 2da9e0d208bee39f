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

// Text returns msg with every occurrence of password replaced by Mask, and every quoted part
// of msg that is a piece of password too (a parser quoting the bad escape it found in it).
func Text(msg, password string) string {
	if password == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, password, Mask)
	var b strings.Builder
	for {
		i := strings.IndexByte(msg, '"')
		if i < 0 {
			break
		}
		j := strings.IndexByte(msg[i+1:], '"')
		if j < 0 {
			break
		}
		quoted := msg[i+1 : i+1+j]
		b.WriteString(msg[:i+1])
		if quoted != "" && strings.Contains(password, quoted) {
			quoted = Mask
		}
		b.WriteString(quoted + `"`)
		msg = msg[i+2+j:]
	}
	return b.String() + msg
}
