package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

const (
	markStart = "<!-- bench-peers:start -->"
	markEnd   = "<!-- bench-peers:end -->"
)

// writeSection puts body between the bench-peers markers of path, replacing what was there, or
// appends the marked section at the end when the markers are absent.
func writeSection(path, body string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	text := string(old)
	section := markStart + "\n" + strings.TrimRight(body, "\n") + "\n" + markEnd + "\n"
	i := strings.Index(text, markStart)
	j := strings.Index(text, markEnd)
	switch {
	case i >= 0 && j > i:
		rest := strings.TrimPrefix(text[j+len(markEnd):], "\n")
		text = text[:i] + section + rest
	case i >= 0 || j >= 0:
		return fmt.Errorf("%s: unbalanced %s / %s markers", path, markStart, markEnd)
	default:
		text = strings.TrimRight(text, "\n") + "\n\n" + section
	}
	return os.WriteFile(path, []byte(text), 0o644)
}

// machine describes the machine in one line: cores, CPU model, memory, OS, Go, redis-server.
func machine() string {
	cpu := firstField("/proc/cpuinfo", "model name")
	mem := firstField("/proc/meminfo", "MemTotal")
	var parts []string
	parts = append(parts, fmt.Sprintf("%d cores", runtime.NumCPU()))
	if cpu != "" {
		parts = append(parts, cpu)
	}
	if mem != "" {
		var kb int64
		fmt.Sscanf(mem, "%d", &kb)
		parts = append(parts, fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20)))
	}
	osName := runtime.GOOS + "/" + runtime.GOARCH
	if pretty := firstField("/etc/os-release", "PRETTY_NAME"); pretty != "" {
		osName = strings.Trim(pretty, `"`) + " " + runtime.GOARCH
	}
	parts = append(parts, osName, runtime.Version())
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		v := strings.Fields(string(out))
		for _, f := range v {
			if s, ok := strings.CutPrefix(f, "v="); ok {
				parts = append(parts, "redis-server "+s)
			}
		}
	}
	return strings.Join(parts, ", ")
}

// firstField returns the value of the first "key: value" or "key=value" line of path.
func firstField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, key) {
			continue
		}
		rest := strings.TrimSpace(line[len(key):])
		rest = strings.TrimPrefix(rest, ":")
		rest = strings.TrimPrefix(rest, "=")
		return strings.TrimSpace(rest)
	}
	return ""
}

// shortMachine is the machine in a few words, for the plot: cores and CPU model.
func shortMachine() string {
	s := fmt.Sprintf("%d cores", runtime.NumCPU())
	if cpu := firstField("/proc/cpuinfo", "model name"); cpu != "" {
		s += ", " + cpu
	}
	return s
}
