// Package fence makes SQL rows check a lock's fencing token, so that a holder paused past its
// lease cannot write over the work of the holder that came after it.
package fence
