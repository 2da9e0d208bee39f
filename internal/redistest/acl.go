package redistest

import (
	"context"
	"fmt"
)

// SetUser runs ACL SETUSER user reset on >password rules... as the default
// user: afterwards user exists, is enabled, logs in with password and has
// exactly rules (for example "~dlock:*", "&dlock:*", "+evalsha").
func (s *Server) SetUser(ctx context.Context, user, password string, rules ...string) error {
	args := append([]string{"ACL", "SETUSER", user, "reset", "on", ">" + password}, rules...)
	if _, err := s.Do(ctx, args...); err != nil {
		return fmt.Errorf("redistest: ACL SETUSER %s: %w", user, err)
	}
	return nil
}

// SetDoUser makes Do (and the readiness probe of Restart) log in as user
// with password (AUTH user password) instead of the default user: for tests
// that restrict the default user and keep an administrator for raw checks.
func (s *Server) SetDoUser(user, password string) {
	s.umu.Lock()
	defer s.umu.Unlock()
	s.doUser, s.doPass = user, password
}

// DoAs sends one command like Do, logged in as user with password (AUTH user
// password) instead of the default user.
func (s *Server) DoAs(ctx context.Context, user, password string, args ...string) (string, error) {
	t := s.target()
	t.user, t.password = user, password
	return do(ctx, t, args)
}

// The ACL rules docs/SECURITY.md documents for a dlock user, as ACL SETUSER arguments after
// "<user> on >password". The tests run with them (the root package's whole suite with ACLRule;
// the adapters' Sentinel and Cluster tests with the additions), and a root test checks that
// the document shows these exact lines.
var (
	// ACLRule: keys and channels under the default prefix "dlock:"; the commands the clients
	// send when they connect and on the pub/sub connection, INFO (the eviction-policy check),
	// the commands of the scripts (the lock key, and the queue's sorted set and hash), the scripts and what they call,
	// WAIT (replica acknowledgement), SCAN (inspection), and PUBSUB NUMSUB and NUMPAT (the
	// scripts ask whether anyone listens on a release channel).
	ACLRule = []string{
		"resetkeys", "~dlock:*", "resetchannels", "&dlock:*", "-@all",
		"+hello", "+ping", "+info",
		"+evalsha", "+eval", "+get", "+set", "+pexpire", "+pttl", "+time", "+publish", "+wait",
		"+exists", "+zadd", "+zrange", "+zrem", "+zcard", "+zscore", "+hget", "+hset", "+hdel", "+hmget", "+hgetall", "+hincrby",
		"+subscribe", "+unsubscribe", "+scan", "+pubsub|numsub", "+pubsub|numpat",
	}
	// ACLSentinelExtra: rueidis asks the server the Sentinels name for its ROLE.
	ACLSentinelExtra = []string{"+role"}
	// ACLClusterExtra: the clients read the slot map (CLUSTER SLOTS on Redis 7, CLUSTER SHARDS
	// from Redis 8 in rueidis), and release notices go over sharded pub/sub.
	ACLClusterExtra = []string{"+cluster|slots", "+cluster|shards", "+ssubscribe", "+sunsubscribe", "+spublish", "+pubsub|shardnumsub"}
)

// ACLUserArgs returns redis-server arguments that create user with password and rules at
// start (a "user" configuration line), so that the user survives Restart: for WithArgs.
func ACLUserArgs(user, password string, rules ...string) []string {
	return append([]string{"--user", user, "on", ">" + password}, rules...)
}
