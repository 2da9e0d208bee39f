package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The floors: what this machine allows, measured in the same run as the locks they bound.
//
//   - Scenario 7's floor (floor_ring.go): one pub/sub message passed around a ring of worker
//     processes, the least a cross-process handoff costs; and (floor_clients.go) a minimal
//     strictly first-in first-out lock (floor_fifo.go) beside dlock and redsync in scenario 7's
//     one-server cases, with client CPU, Redis CPU and context switches per hold.
//   - Scenario 1's CPU state (floor_awake.go): the same pairs with idle vCPUs and with vCPUs
//     kept awake by two nice 19 spinners, with the vCPU halts per pair.

// floorConfig is what the floors measure (a field of config).
type floorConfig struct {
	ringProcs    int           // processes in the ring
	ringDuration time.Duration // per ring measurement
	ringMaxHops  int           // a ring measurement also ends after this many hops
	duration     time.Duration // per measurement of the floor table of scenario 7
	// awakeGoroutines are scenario 1's goroutine counts measured in both CPU states as well.
	awakeGoroutines []int
	spinners        int // busy-loop threads that keep the vCPUs awake
}

func defaultFloorConfig(quick bool) floorConfig {
	f := floorConfig{
		ringProcs:       10,
		ringDuration:    time.Second,
		ringMaxHops:     2_000_000,
		duration:        2 * time.Second,
		awakeGoroutines: []int{1, 4},
		spinners:        2,
	}
	if quick {
		f.ringDuration = 300 * time.Millisecond
		f.duration = 400 * time.Millisecond
	}
	return f
}

// floorWorkers are the child processes the floors re-execute this binary as, by first argument.
var floorWorkers = map[string]func([]string) int{
	ringWorkerFlag:  runRingWorker,
	floorWorkerFlag: runFloorWorker,
	spinFlag:        runSpinner,
}

// runFloorChild runs this process as a floor's child when its first argument names one, and
// exits with the child's status; otherwise it returns.
func runFloorChild() {
	if len(os.Args) > 1 {
		if f, ok := floorWorkers[os.Args[1]]; ok {
			os.Exit(f(os.Args[2:]))
		}
	}
}

// vcpuHalts returns how many times the CPUs have entered an idle state other than polling
// (on a guest: a halt that exits to the hypervisor) since boot, summed over every CPU, from the
// cpuidle counters; ok is false where there are none.
func vcpuHalts() (n uint64, ok bool) {
	dirs, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*/cpuidle/state[0-9]*")
	for _, d := range dirs {
		name, err := os.ReadFile(filepath.Join(d, "name"))
		if err != nil || strings.TrimSpace(string(name)) == "POLL" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "usage"))
		if err != nil {
			continue
		}
		u, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			continue
		}
		n += u
		ok = true
	}
	return n, ok
}

// usage is a process's CPU time and context switches so far (getrusage of itself).
type usage struct {
	cpu               time.Duration // user + system
	voluntary, forced int64         // context switches: waits, preemptions
}

func (u usage) sub(v usage) usage {
	return usage{cpu: u.cpu - v.cpu, voluntary: u.voluntary - v.voluntary, forced: u.forced - v.forced}
}

func (u usage) add(v usage) usage {
	return usage{cpu: u.cpu + v.cpu, voluntary: u.voluntary + v.voluntary, forced: u.forced + v.forced}
}

// switches is every context switch, voluntary or not.
func (u usage) switches() int64 { return u.voluntary + u.forced }

// usageLine is how a worker reports a usage ("ru CPU_NS VOLUNTARY FORCED").
func usageLine(u usage) string {
	return "ru " + strconv.FormatInt(int64(u.cpu), 10) + " " + strconv.FormatInt(u.voluntary, 10) + " " + strconv.FormatInt(u.forced, 10)
}

func parseUsageLine(l string) (usage, bool) {
	f := strings.Fields(l)
	if len(f) != 4 || f[0] != "ru" {
		return usage{}, false
	}
	c, err1 := strconv.ParseInt(f[1], 10, 64)
	v, err2 := strconv.ParseInt(f[2], 10, 64)
	n, err3 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return usage{}, false
	}
	return usage{cpu: time.Duration(c), voluntary: v, forced: n}, true
}

// haltsPer is the halts between the readings h0 and h1 per n events; ok is false when a reading
// failed or the counters went backwards.
func haltsPer(h0, h1 uint64, read bool, n int64) (float64, bool) {
	if !read || h1 < h0 || n <= 0 {
		return 0, false
	}
	return float64(h1-h0) / float64(n), true
}
