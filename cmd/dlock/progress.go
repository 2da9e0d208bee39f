package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progress shows how a long step advances: on a terminal, one line rewritten in place; to a
// file or pipe, a plain line every progressEvery.
type progress struct {
	w     io.Writer
	tty   bool
	last  time.Time
	shown bool // a line is on screen (terminal) and must be cleared before other output
}

const (
	progressEvery    = time.Second
	ttyProgressEvery = 100 * time.Millisecond
)

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = os.Getenv("TERM") != "dumb"
		}
	}
	return p
}

// update shows line; force shows it even when the last line is recent.
func (p *progress) update(line string, force bool) {
	now := time.Now()
	if p.tty {
		if force || now.Sub(p.last) >= ttyProgressEvery {
			fmt.Fprintf(p.w, "\r%s\x1b[K", line)
			p.shown, p.last = true, now
		}
		return
	}
	if force || now.Sub(p.last) >= progressEvery {
		fmt.Fprintln(p.w, line)
		p.last = now
	}
}

// clear removes the in-place line before other output.
func (p *progress) clear() {
	if p.tty && p.shown {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.shown = false
	}
	p.last = time.Time{}
}
