package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// spinFlag re-executes this binary as the spinner of scenario 1's "awake" state: N threads of
// nice 19, each a tight loop, that keep the vCPUs from halting while the measured processes
// wait. At nice 19 a spinner yields to any runnable task of normal priority.
const spinFlag = "__floor-spin"

// spinLimit bounds a spinner's life whatever its parent does.
const spinLimit = 10 * time.Minute

// runSpinner is the spinner's body. Args: THREADS. It says "ready" once every thread spins and
// exits at EOF on stdin (or after spinLimit).
func runSpinner(args []string) int {
	if len(args) != 1 {
		fmt.Println("error: usage: __floor-spin THREADS")
		return 2
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 || n > 64 {
		fmt.Println("error: THREADS must be 1..64")
		return 2
	}
	runtime.GOMAXPROCS(n + 1) // one P left for the goroutine that waits for EOF
	end := time.Now().Add(spinLimit)
	started := make(chan error, n)
	for range n {
		go func() {
			runtime.LockOSThread()
			started <- niceThread()
			var x uint64
			for {
				x++
				if x&(1<<20-1) == 0 && time.Now().After(end) {
					os.Exit(5)
				}
			}
		}()
	}
	for range n {
		if err := <-started; err != nil {
			fmt.Println("error:", oneLine(err))
			return 1
		}
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// spinner is a running spinner process.
type spinner struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	done chan struct{}
}

// startSpinner starts a spinner of threads threads and returns once they all spin.
func startSpinner(threads int) (*spinner, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, spinFlag, strconv.Itoa(threads))
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &spinner{cmd: cmd, in: in, done: make(chan struct{})}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			first <- sc.Text()
		} else {
			first <- ""
		}
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(s.done)
	}()
	select {
	case l := <-first:
		if l == "ready" {
			return s, nil
		}
		s.stop()
		return nil, fmt.Errorf("spinner: %q", strings.TrimPrefix(l, "error: "))
	case <-time.After(20 * time.Second):
		s.stop()
		return nil, errors.New("spinner not ready within 20s")
	}
}

// stop kills the spinner and waits until it is gone.
func (s *spinner) stop() {
	s.in.Close()
	s.cmd.Process.Kill()
	<-s.done
}

// haltsCell is a table cell of vCPU halts per pair ("–" where the counters are missing).
func haltsCell(h float64, ok bool) string {
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.2f", h)
}

// awakeNote explains scenario 1's two CPU states under its tables.
func awakeNote(cfg config) string {
	if len(cfg.floor.awakeGoroutines) == 0 {
		return ""
	}
	var gs []string
	for _, g := range cfg.floor.awakeGoroutines {
		gs = append(gs, strconv.Itoa(g))
	}
	return fmt.Sprintf("\n**CPU state.** An idle vCPU of a virtual machine halts and is woken by the hypervisor, "+
		"which costs tens of microseconds per wake-up: a lock round trip between two processes that each wait "+
		"pays it on the way out and back. At %s goroutine(s) every contender is measured in two states, "+
		"each repetition idle then awake: \"idle vCPUs\" as the other tables, \"awake vCPUs\" with a child process "+
		"of %d threads of nice 19 spinning on a tight loop during the measurement (they yield to any runnable task of "+
		"normal priority, so the vCPUs stay busy but the measured processes run when they are runnable). Compare "+
		"contenders within one state: the ratios hold within a table, not across the two. vCPU halts/pair = the "+
		"increase of the cpuidle counters of every CPU's non-polling states "+
		"(`/sys/devices/system/cpu/cpu*/cpuidle/state*/usage`, all CPUs of the machine, so the shared machine's "+
		"other processes count too) over the measurement ÷ its pairs; \"–\" where the machine has no such counters.\n",
		strings.Join(gs, " and "), cfg.floor.spinners)
}
