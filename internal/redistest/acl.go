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

// DoAs sends one command like Do, logged in as user with password (AUTH user
// password) instead of the default user.
func (s *Server) DoAs(ctx context.Context, user, password string, args ...string) (string, error) {
	t := s.target()
	t.user, t.password = user, password
	return do(ctx, t, args)
}
