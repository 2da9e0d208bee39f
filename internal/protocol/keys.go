package protocol

import "strings"

// A lock called name lives in Redis under one key and announces its releases on one channel
// (docs/PROTOCOL.md):
//
//	key      <prefix>{<tag>}      tag = name, or "{" + name when name starts with '{' or '}'
//	channel  <key>:rel            releases and grants, for whoever listens (inspection tools)
//	channel  <key>:rel:<client>   grants and wake-ups for one waiting client (its client id)
//	queue    <key>:q, <key>:w     the clients waiting for it
//
// The braces make the tag the Redis Cluster hash tag, so that the key, the channel and any
// later key of the same lock share one slot. Redis takes the tag from the first '{' to the
// next '}' and ignores an empty one; a name starting with '}' would give an empty tag, and
// the key and channel would then hash whole, to different slots. Such names, and those
// starting with '{' (so that the form stays one-to-one), get one '{' in front: the tag is
// never empty. The prefix holds no brace (dlock.WithPrefix), so the tag's '{' is the first.

// LockKey returns the key of the lock called name under prefix.
func LockKey(prefix, name string) string {
	if name != "" && (name[0] == '{' || name[0] == '}') {
		return prefix + "{{" + name + "}"
	}
	return prefix + "{" + name + "}"
}

// ReleaseChannel returns the channel on which releases of the lock with this key are announced.
func ReleaseChannel(key string) string { return key + ":rel" }

// GrantChannel returns the channel on which the client with this id hears the grants and
// wake-ups meant for it about the lock with this key: a release tells the client it grants the
// lock to (and, when that client may have died, the one queued next), not every waiting client.
func GrantChannel(key, clientID string) string { return ReleaseChannel(key) + ":" + clientID }

// LockNames returns, for a lock name under prefix, the key, its queue keys (QueueKeys), its
// release channel (ReleaseChannel) and this client's grant channel (GrantChannel), cut from
// one string: a handle made for every Lock, as c.Mutex(name).Lock(ctx) does, pays one
// allocation for them instead of five.
func LockNames(prefix, name, clientID string) (key, queue, entries, channel, grants string) {
	open := "{"
	if name != "" && (name[0] == '{' || name[0] == '}') {
		open = "{{"
	}
	var b strings.Builder
	n := len(prefix) + len(open) + len(name) + 1
	b.Grow(5*n + len(":q:w:rel:rel:") + len(clientID))
	for _, part := range []string{":q", ":w", ":rel", ":rel:" + clientID, ""} {
		b.WriteString(prefix)
		b.WriteString(open)
		b.WriteString(name)
		b.WriteByte('}')
		b.WriteString(part)
	}
	all := b.String()
	at := 0
	cut := func(extra int) string {
		s := all[at : at+n+extra]
		at += n + extra
		return s
	}
	queue, entries, channel, grants, key = cut(2), cut(2), cut(4), cut(5+len(clientID)), cut(0)
	return key, queue, entries, channel, grants
}

// QueueKeys returns the keys of the lock's server-side queue: the sorted set of waiting
// clients, and the hash of their entries (docs/PROTOCOL.md, "The queue").
func QueueKeys(key string) (queue, entries string) { return key + ":q", key + ":w" }

// NameOfKey returns the lock name whose key under prefix is key, or false when key is not
// the key of a lock.
func NameOfKey(prefix, key string) (string, bool) {
	tag, ok := strings.CutPrefix(key, prefix+"{")
	if !ok {
		return "", false
	}
	tag, ok = strings.CutSuffix(tag, "}")
	if !ok || tag == "" {
		return "", false
	}
	if tag[0] == '{' {
		name := tag[1:]
		if name == "" || (name[0] != '{' && name[0] != '}') {
			return "", false // not a form LockKey makes
		}
		return name, true
	}
	if tag[0] == '}' {
		return "", false
	}
	return tag, true
}

// KeyPattern returns a SCAN MATCH pattern for the keys of every lock whose name starts with
// namePrefix, under prefix. It can match keys that are not lock keys; NameOfKey tells.
func KeyPattern(prefix, namePrefix string) string {
	tag := namePrefix
	if tag != "" && (tag[0] == '{' || tag[0] == '}') {
		tag = "{" + tag
	}
	return globEscape(prefix+"{"+tag) + "*}"
}

// globEscape quotes the characters SCAN's MATCH pattern treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ { // bytewise: names are any bytes
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
