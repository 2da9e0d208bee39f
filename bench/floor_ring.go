package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Scenario 7's message floor: ONE pub/sub message passed around a ring of worker processes on
// one redis-server. Process i subscribes to its channel and, on each message, publishes to the
// channel of process i+1: every hop is what a handoff between processes cannot do without (a
// PUBLISH, the server's delivery, the next process waking up), and nothing else.

// ringWorkerFlag re-executes this binary as one process of the ring.
const ringWorkerFlag = "__floor-ring"

// ringModes are the ring's clients: a bare RESP connection pair (the floor itself) and rueidis
// (the transport of dlock and of the minimal FIFO handoff).
var ringModes = []struct{ name, config string }{
	{"raw RESP", "two bare TCP connections per process (one subscribed, one that publishes), RESP written and parsed " +
		"by the bench; the reply to a PUBLISH is read just before the next PUBLISH (it has long arrived), so a hop " +
		"wakes each process once"},
	{"rueidis", "one rueidis client per process with its defaults (RESP3, no flush delay): `Receive` on the own " +
		"channel, whose handler hands the message to a goroutine that calls `Do(PUBLISH)` and waits for its reply"},
}

// ringEnd is the message that stops the ring: it goes around once more, each process reporting.
const ringEnd = "e"

// runRingWorker is one process of the ring. Args: MODE ADDR TAG I N DURATION MAXHOPS. It
// subscribes to channel TAG:I, says "ready", waits for "go"; process 0 then publishes hop 1 to
// TAG:1. A process receiving hop k publishes k+1 to the next channel, unless the time is up or k
// is MAXHOPS: then it reports "stop K UNIXNANO" and sends the end message around. Each process
// reports its usage from "go" to the end message ("ru ..."), process 0 also "start UNIXNANO".
func runRingWorker(args []string) int {
	time.AfterFunc(2*time.Minute, func() { os.Exit(4) })
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	fail := func(err error) int {
		fmt.Fprintln(out, "error:", oneLine(err))
		return 1
	}
	if len(args) != 7 {
		return fail(errors.New("usage: __floor-ring MODE ADDR TAG I N DURATION MAXHOPS"))
	}
	i, err1 := strconv.Atoi(args[3])
	n, err2 := strconv.Atoi(args[4])
	d, err3 := time.ParseDuration(args[5])
	maxHops, err4 := strconv.Atoi(args[6])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || n < 2 || i < 0 || i >= n {
		return fail(errors.New("bad arguments"))
	}
	mine, next := args[2]+":"+strconv.Itoa(i), args[2]+":"+strconv.Itoa((i+1)%n)
	var rg ringConn
	var err error
	switch args[0] {
	case ringModes[0].name:
		rg, err = dialRawRing(args[1], mine)
	case ringModes[1].name:
		rg, err = dialRueidisRing(args[1], mine)
	default:
		err = fmt.Errorf("no ring mode %q", args[0])
	}
	if err != nil {
		return fail(err)
	}
	defer rg.close()
	fmt.Fprintln(out, "ready")
	out.Flush()
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "go" {
		return fail(fmt.Errorf("no go signal: %q %v", line, err))
	}
	u0 := selfUsage()
	end := time.Now().Add(d)
	if i == 0 {
		fmt.Fprintln(out, "start", time.Now().UnixNano())
		if err := rg.publish(next, "1"); err != nil {
			return fail(err)
		}
	}
	stopper := false
	for {
		msg, err := rg.receive()
		if err != nil {
			return fail(err)
		}
		if msg == ringEnd {
			fmt.Fprintln(out, usageLine(selfUsage().sub(u0)))
			if !stopper {
				if err := rg.publish(next, ringEnd); err != nil {
					return fail(err)
				}
			}
			break
		}
		k, err := strconv.Atoi(msg)
		if err != nil {
			return fail(fmt.Errorf("bad message %q", msg))
		}
		if k >= maxHops || time.Now().After(end) {
			fmt.Fprintln(out, "stop", k, time.Now().UnixNano())
			stopper = true
			if err := rg.publish(next, ringEnd); err != nil {
				return fail(err)
			}
			continue
		}
		if err := rg.publish(next, strconv.Itoa(k+1)); err != nil {
			return fail(err)
		}
	}
	fmt.Fprintln(out, "done")
	return 0
}

// ringConn is one ring process's connection to the server.
type ringConn interface {
	publish(channel, msg string) error
	receive() (string, error) // the next message on the own channel
	close()
}

// rawRing speaks RESP over two bare connections.
type rawRing struct {
	sub, pub   net.Conn
	subR, pubR *bufio.Reader
	pending    bool // a PUBLISH reply not read yet
}

func respCommand(args ...string) []byte {
	b := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b = append(b, "$"+strconv.Itoa(len(a))+"\r\n"+a+"\r\n"...)
	}
	return b
}

// respLine reads one line of a reply without its CRLF; a server error is an error.
func respLine(r *bufio.Reader) (string, error) {
	l, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	l = strings.TrimSuffix(l, "\r\n")
	if strings.HasPrefix(l, "-") {
		return "", errors.New("redis: " + l[1:])
	}
	return l, nil
}

// respArray reads an array reply of bulk strings and integers, as strings.
func respArray(r *bufio.Reader) ([]string, error) {
	l, err := respLine(r)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(l, "*") {
		return nil, fmt.Errorf("redis: unexpected reply %q", l)
	}
	n, err := strconv.Atoi(l[1:])
	if err != nil || n < 0 || n > 16 {
		return nil, fmt.Errorf("redis: unexpected reply %q", l)
	}
	var out []string
	for range n {
		e, err := respLine(r)
		if err != nil {
			return nil, err
		}
		switch {
		case strings.HasPrefix(e, ":"):
			out = append(out, e[1:])
		case strings.HasPrefix(e, "$"):
			size, err := strconv.Atoi(e[1:])
			if err != nil || size < 0 || size > 1<<20 {
				return nil, fmt.Errorf("redis: unexpected element %q", e)
			}
			buf := make([]byte, size+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return nil, err
			}
			out = append(out, string(buf[:size]))
		default:
			return nil, fmt.Errorf("redis: unexpected element %q", e)
		}
	}
	return out, nil
}

func dialRawRing(addr, channel string) (ringConn, error) {
	sub, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	pub, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		sub.Close()
		return nil, err
	}
	r := &rawRing{sub: sub, pub: pub, subR: bufio.NewReader(sub), pubR: bufio.NewReader(pub)}
	sub.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := sub.Write(respCommand("SUBSCRIBE", channel)); err != nil {
		r.close()
		return nil, err
	}
	if a, err := respArray(r.subR); err != nil || len(a) != 3 || a[0] != "subscribe" {
		r.close()
		return nil, fmt.Errorf("subscribe: %q %v", a, err)
	}
	sub.SetDeadline(time.Time{})
	return r, nil
}

func (r *rawRing) publish(channel, msg string) error {
	if r.pending {
		if _, err := respLine(r.pubR); err != nil {
			return err
		}
	}
	_, err := r.pub.Write(respCommand("PUBLISH", channel, msg))
	r.pending = err == nil
	return err
}

func (r *rawRing) receive() (string, error) {
	// A message can only be late if the ring broke: bound the wait.
	r.sub.SetReadDeadline(time.Now().Add(30 * time.Second))
	a, err := respArray(r.subR)
	if err != nil {
		return "", err
	}
	if len(a) != 3 || a[0] != "message" {
		return "", fmt.Errorf("redis: unexpected push %q", a)
	}
	return a[2], nil
}

func (r *rawRing) close() {
	r.sub.Close()
	r.pub.Close()
}

// rueidisRing receives through rueidis's Receive and publishes with Do.
type rueidisRing struct {
	c      rueidis.Client
	msgs   chan string
	cancel context.CancelFunc
	done   chan struct{}
}

func dialRueidisRing(addr, channel string) (ringConn, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &rueidisRing{c: c, msgs: make(chan string, 16), cancel: cancel, done: make(chan struct{})}
	const ping = "ping"
	live := make(chan struct{}, 1)
	go func() {
		defer close(r.done)
		c.Receive(ctx, c.B().Subscribe().Channel(channel).Build(), func(m rueidis.PubSubMessage) {
			if m.Message == ping {
				select {
				case live <- struct{}{}:
				default:
				}
				return
			}
			r.msgs <- m.Message
		})
	}()
	// Publish pings to the own channel until one comes back: the subscription is then live.
	deadline := time.After(5 * time.Second)
	for {
		pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.Do(pctx, c.B().Publish().Channel(channel).Message(ping).Build()).Error()
		pcancel()
		if err != nil {
			r.close()
			return nil, err
		}
		select {
		case <-live:
			return r, nil
		case <-deadline:
			r.close()
			return nil, errors.New("rueidis: subscription not live within 5s")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (r *rueidisRing) publish(channel, msg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.c.Do(ctx, r.c.B().Publish().Channel(channel).Message(msg).Build()).Error()
}

func (r *rueidisRing) receive() (string, error) {
	select {
	case m := <-r.msgs:
		return m, nil
	case <-time.After(30 * time.Second):
		return "", errors.New("no message within 30s")
	}
}

func (r *rueidisRing) close() {
	r.cancel()
	r.c.Close()
	<-r.done
}

// ringResult is one ring measurement.
type ringResult struct {
	hops     int
	elapsed  time.Duration
	client   usage // summed over the processes
	redisCPU time.Duration
	err      error
}

func (r ringResult) rate() float64 { return float64(r.hops) / r.elapsed.Seconds() }

// runRing runs one ring of cfg.floor.ringProcs processes in mode on srv.
func runRing(srv *server, cfg config, mode, tag string) ringResult {
	n := cfg.floor.ringProcs
	var argss [][]string
	for i := 0; i < n; i++ {
		argss = append(argss, []string{ringWorkerFlag, mode, srv.Addr, tag, strconv.Itoa(i), strconv.Itoa(n),
			cfg.floor.ringDuration.String(), strconv.Itoa(cfg.floor.ringMaxHops)})
	}
	ws, err := startFloorChildren(argss)
	defer stopFloorChildren(ws)
	if err != nil {
		return ringResult{err: err}
	}
	cpu0 := srv.cpu()
	for _, w := range ws {
		io.WriteString(w.in, "go\n")
	}
	var r ringResult
	var start, stop int64
	limit := time.After(cfg.floor.ringDuration + 30*time.Second)
	for p, w := range ws {
		finished := false
		for !finished {
			select {
			case l, ok := <-w.lines:
				switch {
				case !ok:
					return ringResult{err: fmt.Errorf("ring process %d exited without finishing", p)}
				case l == "done":
					finished = true
				case strings.HasPrefix(l, "error:"):
					return ringResult{err: fmt.Errorf("ring process %d: %s", p, strings.TrimSpace(l[6:]))}
				case strings.HasPrefix(l, "ru "):
					u, ok := parseUsageLine(l)
					if !ok {
						return ringResult{err: fmt.Errorf("ring process %d: bad line %q", p, l)}
					}
					r.client = r.client.add(u)
				case strings.HasPrefix(l, "start "):
					start, _ = strconv.ParseInt(l[6:], 10, 64)
				case strings.HasPrefix(l, "stop "):
					if _, err := fmt.Sscanf(l, "stop %d %d", &r.hops, &stop); err != nil {
						return ringResult{err: fmt.Errorf("ring process %d: bad line %q", p, l)}
					}
				}
			case <-limit:
				return ringResult{err: fmt.Errorf("ring process %d did not finish within %v", p, cfg.floor.ringDuration+30*time.Second)}
			}
		}
	}
	r.redisCPU = srv.cpu() - cpu0
	r.elapsed = time.Duration(stop - start)
	if r.hops == 0 || r.elapsed <= 0 {
		return ringResult{err: errors.New("the ring made no hop")}
	}
	return r
}

// floorRingSection measures and writes the message floor of scenario 7.
func floorRingSection(srv *server, cfg config) string {
	res := map[string][]ringResult{}
	for rep := 0; rep < cfg.reps; rep++ {
		for i := range ringModes {
			m := ringModes[(i+rep)%len(ringModes)].name
			srv.flush()
			stop := watchdog("scenario 7 floor, ring, "+m, cfg.floor.ringDuration+90*time.Second)
			r := runRing(srv, cfg, m, fmt.Sprintf("ring:%d:%d", rep, i))
			stop()
			if r.err != nil {
				cfg.logf("scenario 7 floor, ring, rep %d, %s: %v", rep+1, m, r.err)
			} else {
				h := float64(r.hops)
				cfg.logf("scenario 7 floor, ring, rep %d, %-8s %7.0f hops/s, client CPU %.1f µs/hop, %.2f switches/hop, Redis CPU %.1f µs/hop",
					rep+1, m, r.rate(), float64(r.client.cpu.Nanoseconds())/1000/h, float64(r.client.switches())/h, float64(r.redisCPU.Nanoseconds())/1000/h)
			}
			res[m] = append(res[m], r)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n**The message floor: one pub/sub message around a ring of %d processes.** Process i subscribes "+
		"to its channel and, on each message, publishes to process i+1's; one message circulates, so every hop is "+
		"one PUBLISH, the server's delivery and the next process waking up: what each handoff between processes "+
		"costs at least. %v per measurement (or %s hops), median of %d repetitions, the clients interleaved. Hops/s = "+
		"hops ÷ the time from the first PUBLISH to the stop; client CPU and context switches (voluntary + involuntary) "+
		"per hop: `getrusage(RUSAGE_SELF)` of each process from \"go\" to the end, summed over the processes, ÷ the "+
		"hops; Redis CPU per hop: the server's user+system time (INFO cpu) over the run ÷ the hops. The dlock "+
		"handoff of the empty case above is at least one such hop plus its scripts.\n\n",
		cfg.floor.ringProcs, cfg.floor.ringDuration, thousands(float64(cfg.floor.ringMaxHops)), cfg.reps)
	b.WriteString("| ring client | hops/s (median) | µs per hop | client CPU µs/hop | context switches/hop | Redis CPU µs/hop |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	for _, mode := range ringModes {
		var rates, cpu, sw, rcpu []float64
		var lastErr error
		for _, r := range res[mode.name] {
			if r.err != nil {
				lastErr = r.err
				continue
			}
			h := float64(r.hops)
			rates = append(rates, r.rate())
			cpu = append(cpu, float64(r.client.cpu.Nanoseconds())/1000/h)
			sw = append(sw, float64(r.client.switches())/h)
			rcpu = append(rcpu, float64(r.redisCPU.Nanoseconds())/1000/h)
		}
		if len(rates) == 0 {
			fmt.Fprintf(&b, "| %s | error: %s | | | | |\n", mode.name, oneLine(lastErr))
			continue
		}
		rate := median(rates)
		fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.2f | %.1f |\n", mode.name, thousands(rate), 1e6/rate, median(cpu), median(sw), median(rcpu))
		if cfg.fig != nil && mode.name == ringModes[0].name {
			cfg.fig.info("7, floor", fmt.Sprintf("pub/sub ring of %d processes (raw RESP)", cfg.floor.ringProcs), "%s hops/s, %.1f µs per hop", thousands(rate), 1e6/rate)
		}
	}
	b.WriteString("\n")
	for _, mode := range ringModes {
		fmt.Fprintf(&b, "- **%s**: %s.\n", mode.name, mode.config)
	}
	return b.String()
}
