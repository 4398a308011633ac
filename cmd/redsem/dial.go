//go:build unix

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/gomodule/redigo/redis"
)

// connError is a connection that could not be set up: Redis unreachable,
// not Redis at all, or refusing the login or the database. Its message is
// the one line report prints, without the operation that needed the
// connection: the fault is in the URL or the server, not in the semaphore.
type connError struct {
	msg string
	err error
}

func (e *connError) Error() string { return e.msg }
func (e *connError) Unwrap() error { return e.err }

// dialRedis opens one connection to t with opts (redigo sends AUTH and
// SELECT while dialing, as the URL asks) and makes sure a Redis answers
// there: HELLO 2 is the one command every Redis user may send, logged in or
// not (an ACL cannot forbid it, unlike PING), and the RESP2 it asks for is
// what redigo reads. A Redis too old for HELLO answers with an error, which
// is still a Redis answer.
func dialRedis(ctx context.Context, t target, opts []redis.DialOption) (redis.Conn, error) {
	c, err := redis.DialContext(ctx, t.network, t.addr, opts...)
	if err != nil {
		if t.tls && notTLS(err) {
			return nil, &connError{msg: fmt.Sprintf("%s: this server does not speak TLS: a plain Redis port wants redis://", t.shown), err: err}
		}
		return nil, dialError(err, t)
	}
	if _, err := redis.DoWithTimeout(c, dialTimeout, "HELLO", "2"); err != nil {
		var re redis.Error
		if !errors.As(err, &re) || strings.HasPrefix(string(re), "NOAUTH") {
			c.Close()
			return nil, dialError(err, t)
		}
	}
	return c, nil
}

// dialError explains an error of dialRedis in one line.
func dialError(err error, t target) error {
	var (
		re redis.Error
		ne net.Error
	)
	at := t.shown
	msg := ""
	switch {
	case errors.As(err, &re):
		r := string(re)
		switch {
		case strings.HasPrefix(r, "WRONGPASS"):
			msg = fmt.Sprintf("Redis at %s refused the user name or password (%s)", at, r)
		case strings.HasPrefix(r, "NOAUTH"):
			msg = fmt.Sprintf("Redis at %s requires a password (NOAUTH): give it in the URL, redis://[USER]:PASSWORD@HOST[:PORT]", at)
		case strings.HasPrefix(r, "ERR AUTH") && strings.Contains(r, "without any password configured"):
			msg = fmt.Sprintf("Redis at %s has no password set, but the URL gives one (%s)", at, r)
		case strings.Contains(r, "DB index is out of range"):
			msg = fmt.Sprintf("Redis at %s has no database %d (%s; see its databases setting)", at, t.db, r)
		case strings.HasPrefix(r, "NOPERM") && strings.Contains(r, "'select'"):
			msg = fmt.Sprintf("Redis at %s: this user may not select database %d (%s): allow +select or use database 0", at, t.db, r)
		default:
			msg = fmt.Sprintf("Redis at %s refused the connection: %s", at, r)
		}
	case errors.As(err, &ne) && ne.Timeout() && !isDialStep(err):
		msg = fmt.Sprintf("%s accepted the connection but sent no Redis reply within %v: is it a Redis port?", at, dialTimeout)
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		msg = fmt.Sprintf("%s closed the connection without a Redis reply: is it a Redis port (a TLS one wants rediss://)?", at)
	case strings.HasPrefix(err.Error(), "redigo: ") && !isDialStep(err):
		// redigo's protocol errors: a reply that is not RESP.
		msg = fmt.Sprintf("%s does not speak the Redis protocol: is it a Redis port?", at)
	default:
		msg = fmt.Sprintf("cannot reach Redis at %s: %v", at, err)
	}
	return &connError{msg: msg, err: err}
}

// notTLS reports whether the TLS handshake of a dial that reached its
// server failed the way it does against a server that does not speak TLS,
// such as a plain Redis: no answer to the ClientHello (the handshake times
// out), an answer that is not a TLS record (Redis's error reply to the bytes
// it read as a command), or the connection closed.
func notTLS(err error) bool {
	var (
		rh tls.RecordHeaderError
		ne net.Error
	)
	if isDialStep(err) {
		return false // the TCP connect failed: no handshake began
	}
	return errors.As(err, &rh) || errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// isDialStep reports whether err comes from opening the connection (DNS,
// TCP connect, TLS handshake) rather than from reading a reply.
func isDialStep(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}
