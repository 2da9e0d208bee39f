package backend

import "github.com/dlock-go/dlock/internal/errs"

// joinErrors is errs.Join, under a name that a local slice of errors called errs does not hide.
func joinErrors(e ...error) error { return errs.Join(e...) }
