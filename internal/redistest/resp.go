package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// defaultDoTimeout bounds Do when ctx has no deadline, so a paused or
// partitioned server cannot hang a test forever.
const defaultDoTimeout = 10 * time.Second

const (
	maxBulkLen    = 512 << 20 // Redis' own proto-max-bulk-len default
	maxArrayLen   = 1 << 20
	maxReplyDepth = 32
)

// Error is an error reply from Redis, such as "ERR unknown command" or
// "WRONGTYPE ...". Msg is the reply text without the leading '-'.
type Error struct {
	Msg string
}

func (e *Error) Error() string { return "redis: " + e.Msg }

// Do dials addr, sends one command encoded as a RESP2 array of bulk strings,
// reads one reply and closes the connection. The reply is rendered as text:
// simple and bulk strings as-is, integers in decimal, nil as "", arrays as
// their elements joined by "\n". An error reply is returned as *Error. If ctx
// has no deadline, a 10s timeout applies.
func Do(ctx context.Context, addr string, args ...string) (string, error) {
	return do(ctx, target{addr: addr}, args)
}

// target is where do sends a command and how it logs in.
type target struct {
	addr     string
	user     string      // AUTH user password when set, else AUTH password
	password string      // sent with AUTH first, when set
	tls      *tls.Config // when set, the connection is TLS
}

// do is Do that first sends AUTH password, pipelined, if password is set,
// and speaks TLS when t.tls is set.
func do(ctx context.Context, t target, args []string) (string, error) {
	addr, password := t.addr, t.password
	if len(args) == 0 {
		return "", errors.New("redistest: do: no command")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultDoTimeout)
		defer cancel()
	}
	dl, _ := ctx.Deadline()
	fail := func(err error) (string, error) {
		ctxErr := ctx.Err()
		if ctxErr == nil && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(dl) {
			// The connection deadline equals ctx's and may fire first.
			ctxErr = context.DeadlineExceeded
		}
		if ctxErr != nil && !errors.Is(err, ctxErr) {
			return "", fmt.Errorf("redistest: %s %s: %w: %w", args[0], addr, ctxErr, err)
		}
		return "", fmt.Errorf("redistest: %s %s: %w", args[0], addr, err)
	}

	var d net.Dialer
	var conn net.Conn
	var err error
	if t.tls != nil {
		td := tls.Dialer{NetDialer: &d, Config: t.tls}
		conn, err = td.DialContext(ctx, "tcp", addr)
	} else {
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(dl); err != nil {
		return fail(err)
	}
	// Cancellation before the deadline interrupts blocked I/O too.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var req []byte
	switch {
	case t.user != "":
		req = appendCommand(req, []string{"AUTH", t.user, password})
	case password != "":
		req = appendCommand(req, []string{"AUTH", password})
	}
	req = appendCommand(req, args)
	if _, err := conn.Write(req); err != nil {
		return fail(err)
	}
	r := bufio.NewReader(conn)
	if password != "" || t.user != "" {
		rep, err := readReply(r, 0)
		if err != nil {
			return fail(err)
		}
		if rep.err != nil {
			return "", fmt.Errorf("redistest: AUTH %s: %w", addr, rep.err)
		}
	}
	rep, err := readReply(r, 0)
	if err != nil {
		return fail(err)
	}
	if rep.err != nil {
		return "", rep.err
	}
	return rep.String(), nil
}

// appendCommand appends args to b as a RESP array of bulk strings.
func appendCommand(b []byte, args []string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, '\r', '\n')
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

// reply is one decoded RESP2 value.
type reply struct {
	str   string  // simple string, bulk string, or integer in decimal
	err   *Error  // error reply
	elems []reply // array elements
	array bool
	null  bool // null bulk string or null array
}

// String renders r as described for Do; nested arrays are flattened.
func (r reply) String() string {
	switch {
	case r.err != nil:
		return r.err.Msg
	case r.array:
		parts := make([]string, len(r.elems))
		for i, e := range r.elems {
			parts[i] = e.String()
		}
		return strings.Join(parts, "\n")
	default:
		return r.str
	}
}

// readReply decodes one RESP2 value from r.
func readReply(r *bufio.Reader, depth int) (reply, error) {
	if depth > maxReplyDepth {
		return reply{}, errors.New("protocol error: reply nested too deeply")
	}
	line, err := readLine(r)
	if err != nil {
		return reply{}, err
	}
	if line == "" {
		return reply{}, errors.New("protocol error: empty line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return reply{str: body}, nil
	case '-':
		return reply{err: &Error{Msg: body}}, nil
	case ':':
		if _, err := strconv.ParseInt(body, 10, 64); err != nil {
			return reply{}, fmt.Errorf("protocol error: bad integer %q", body)
		}
		return reply{str: body}, nil
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < -1 || n > maxBulkLen {
			return reply{}, fmt.Errorf("protocol error: bad bulk length %q", body)
		}
		if n == -1 {
			return reply{null: true}, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return reply{}, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return reply{}, errors.New("protocol error: bulk string not terminated by CRLF")
		}
		return reply{str: string(buf[:n])}, nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < -1 || n > maxArrayLen {
			return reply{}, fmt.Errorf("protocol error: bad array length %q", body)
		}
		if n == -1 {
			return reply{array: true, null: true}, nil
		}
		rep := reply{array: true, elems: make([]reply, n)}
		for i := range rep.elems {
			if rep.elems[i], err = readReply(r, depth+1); err != nil {
				return reply{}, err
			}
		}
		return rep, nil
	default:
		return reply{}, fmt.Errorf("protocol error: unexpected type byte %q", line[0])
	}
}

// readLine reads one CRLF-terminated line and returns it without the CRLF.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if err == io.EOF && line != "" {
			err = io.ErrUnexpectedEOF
		}
		return "", err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return "", fmt.Errorf("protocol error: line not terminated by CRLF: %q", line)
	}
	return line[:len(line)-2], nil
}
