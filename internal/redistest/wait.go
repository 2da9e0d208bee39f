package redistest

import "context"

// Poll calls check until it returns nil or ctx ends, backing off from 5 ms to 100 ms between
// calls; then it returns ctx's error with check's last complaint. Tests use it to wait for a
// condition they cannot be told about, instead of sleeping and hoping.
func Poll(ctx context.Context, what string, check func(ctx context.Context) error) error {
	return poll(ctx, what, check)
}
