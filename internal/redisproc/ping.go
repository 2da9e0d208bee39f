package redisproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// maxInfoLen bounds the INFO reply Ping reads (a real one is a few kilobytes).
const maxInfoLen = 1 << 20

// Ping reports whether a Redis server answers PING on addr (nil: it does), over plain TCP
// without logging in. With pid > 0 it also asks INFO server and fails if the server says it
// is another process, so that a stranger that won the race for the port is not taken for the
// child. A server that answers PING with an error other than LOADING or BUSY (one that wants
// a password, say) counts as answering: it speaks Redis, though its pid cannot be checked;
// so does one that refuses INFO. It is the default Config.Ready.
func Ping(ctx context.Context, addr string, pid int) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return err
		}
	}
	// Cancellation before the deadline interrupts blocked I/O too.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	req := "*1\r\n$4\r\nPING\r\n"
	if pid > 0 {
		req += "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"
	}
	if _, err := io.WriteString(conn, req); err != nil {
		return err
	}
	r := bufio.NewReader(conn)
	line, err := readLine(r)
	if err != nil {
		return err
	}
	switch {
	case line == "+PONG":
	case strings.HasPrefix(line, "-LOADING"), strings.HasPrefix(line, "-BUSY"):
		return fmt.Errorf("not ready: %s", line[1:])
	case strings.HasPrefix(line, "-"):
		return nil
	default:
		return fmt.Errorf("PING answered %q", line)
	}
	if pid <= 0 {
		return nil
	}
	line, err = readLine(r)
	if err != nil {
		return err
	}
	if strings.HasPrefix(line, "-") {
		return nil // INFO refused (ACL rules, say): the pid cannot be checked
	}
	n, err := strconv.Atoi(strings.TrimPrefix(line, "$"))
	if !strings.HasPrefix(line, "$") || err != nil || n < 0 || n > maxInfoLen {
		return fmt.Errorf("INFO answered %q", line)
	}
	body := make([]byte, n+2)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	for _, l := range strings.Split(string(body[:n]), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
			if v != strconv.Itoa(pid) {
				return fmt.Errorf("%s is served by pid %s, not %d", addr, v, pid)
			}
			return nil
		}
	}
	return nil
}

// readLine reads one CRLF-terminated line and returns it without the CRLF.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) && line != "" {
			err = io.ErrUnexpectedEOF
		}
		return "", err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return "", fmt.Errorf("protocol error: line not terminated by CRLF: %q", line)
	}
	return line[:len(line)-2], nil
}
