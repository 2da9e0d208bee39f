package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// workerProc is one worker process of the demo, seen from the parent.
type workerProc struct {
	id     int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *tailBuffer
	ready  chan struct{} // closed when the worker printed "ready"
	exited chan struct{} // closed once the process has been reaped; then err is set
	err    error

	mu     sync.Mutex // guards frozen
	frozen bool
}

// startWorker runs this program again with args, as worker id.
func startWorker(exe string, id int, args []string) (*workerProc, error) {
	cmd := exec.Command(exe, args...)
	cmd.SysProcAttr = childAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w := &workerProc{
		id: id, cmd: cmd, stdin: stdin, stderr: &tailBuffer{max: 8 << 10},
		ready: make(chan struct{}), exited: make(chan struct{}),
	}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %d: %w", id, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		readyOnce := false
		for sc.Scan() {
			if sc.Text() == "ready" && !readyOnce {
				readyOnce = true
				close(w.ready)
			}
		}
		w.err = cmd.Wait() // after the last read of stdout, as exec requires
		close(w.exited)
	}()
	return w, nil
}

func (w *workerProc) pid() int { return w.cmd.Process.Pid }

func (w *workerProc) hasExited() bool {
	select {
	case <-w.exited:
		return true
	default:
		return false
	}
}

// send writes one line to the worker; a worker that has exited is not an error here (its
// exit is reported by whoever watches it).
func (w *workerProc) send(line string) {
	io.WriteString(w.stdin, line+"\n")
}

func (w *workerProc) pause() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := pauseProcess(w.cmd.Process); err != nil {
		return fmt.Errorf("freeze worker %d (pid %d): %w", w.id, w.pid(), err)
	}
	w.frozen = true
	return nil
}

func (w *workerProc) resume() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.frozen {
		return nil
	}
	w.frozen = false
	if err := resumeProcess(w.cmd.Process); err != nil && !w.hasExited() {
		return fmt.Errorf("resume worker %d (pid %d): %w", w.id, w.pid(), err)
	}
	return nil
}

// kill ends the worker if it still runs (SIGKILL also ends a stopped process) and waits until
// it has been reaped.
func (w *workerProc) kill() {
	if !w.hasExited() {
		w.cmd.Process.Kill()
	}
	w.stdin.Close()
	<-w.exited
}

// exitError describes why the worker is gone, with the end of what it wrote to stderr.
func (w *workerProc) exitError(what string) error {
	msg := fmt.Sprintf("worker %d (pid %d) %s", w.id, w.pid(), what)
	if w.hasExited() && w.err != nil {
		msg += ": " + w.err.Error()
	}
	if s := strings.TrimSpace(w.stderr.String()); s != "" {
		msg += ": " + s
	}
	return errors.New(msg)
}

// waitReady waits until every worker has connected to Redis.
func waitReady(ctx context.Context, workers []*workerProc) error {
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	for _, w := range workers {
		select {
		case <-w.ready:
		case <-w.exited:
			return w.exitError("exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return w.exitError(fmt.Sprintf("not ready after %v", readyTimeout))
		}
	}
	return nil
}

// stopWorkers tells every worker the sale is over and waits for them to exit cleanly.
func stopWorkers(workers []*workerProc) error {
	for _, w := range workers {
		w.send("stop")
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	var errs []error
	for _, w := range workers {
		select {
		case <-w.exited:
			if w.err != nil {
				errs = append(errs, w.exitError("failed"))
			}
		case <-timer.C:
			return errors.Join(append(errs, w.exitError(fmt.Sprintf("did not stop within %v", stopTimeout)))...)
		}
	}
	return errors.Join(errs...)
}

// tailBuffer keeps the last max bytes written to it. exec.Cmd copies a worker's stderr into
// it from its own goroutine, hence the mutex.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
