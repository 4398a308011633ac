//go:build unix

package main

import (
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
)

// fakeServer listens on a loopback port and answers every connection with
// handle; it stops when the test ends.
func fakeServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// A URL that leads to something other than a usable Redis gets one
// accurate line, exit 69: not Redis at all, a wrong or missing password, a
// password the server does not want, a database it does not have, a
// database the ACL user may not select, TLS toward a plain port, no
// sentinel where the URL says.
func TestConnectionErrors(t *testing.T) {
	t.Parallel()
	httpLike := fakeServer(t, func(c net.Conn) {
		buf := make([]byte, 512)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
	})
	hangUp := fakeServer(t, func(c net.Conn) {})
	withPass := redistest.Start(t)
	withPass.Do(t, "CONFIG", "SET", "requirepass", "s3cret") // after Start, whose readiness PING has no password
	plain := redistest.Start(t)
	plain.Do(t, "ACL", "SETUSER", "nosel", "on", ">pw", "~*", "+@all", "-select")

	for _, tc := range []struct {
		url, want string
	}{
		{"redis://" + httpLike, "redsem: redis://" + httpLike + " does not speak the Redis protocol: is it a Redis port?"},
		{"redis://" + hangUp, "redsem: redis://" + hangUp + " closed the connection without a Redis reply: is it a Redis port (a TLS one wants rediss://)?"},
		{"redis://:wrong@" + withPass.Addr, "redsem: Redis at redis://:xxxxx@" + withPass.Addr + " refused the user name or password (WRONGPASS"},
		{"redis://" + withPass.Addr, "redsem: Redis at redis://" + withPass.Addr + " requires a password (NOAUTH): give it in the URL"},
		{"redis://:pw@" + plain.Addr, "redsem: Redis at redis://:xxxxx@" + plain.Addr + " has no password set, but the URL gives one"},
		{"redis://" + plain.Addr + "/99", "redsem: Redis at redis://" + plain.Addr + "/99 has no database 99 (ERR DB index is out of range"},
		{"redis://nosel:pw@" + plain.Addr + "/2", "redsem: Redis at redis://nosel:xxxxx@" + plain.Addr + "/2: this user may not select database 2"},
		{"redis://127.0.0.1:1", "redsem: cannot reach Redis at redis://127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused"},
		// TLS toward a plain port: Redis leaves the ClientHello unanswered
		// (or answers it with an error reply), a fake server hangs up.
		{"rediss://" + plain.Addr, "redsem: rediss://" + plain.Addr + ": this server does not speak TLS: a plain Redis port wants redis://"},
		{"rediss://" + httpLike, "redsem: rediss://" + httpLike + ": this server does not speak TLS"},
		{"rediss://" + hangUp, "redsem: rediss://" + hangUp + ": this server does not speak TLS"},
		// No sentinel at the address: said at once, not after the wait for
		// a failover.
		{"redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster", "redsem: cannot reach Redis at redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster: no sentinel listens at 127.0.0.1:1, 127.0.0.1:2 ("},
	} {
		e := &env{url: tc.url, dir: t.TempDir()}
		for _, args := range [][]string{{"status", "x"}, {"run", "x", "--", "true"}} {
			r := e.run(t, args...)
			assert.Equal(t, exitUnavailable, r.code, "%s %v: %s", tc.url, args, r.stderr)
			assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "%s %v: one line: %q", tc.url, args, r.stderr)
			assert.True(t, strings.HasPrefix(r.stderr, tc.want), "%s %v:\n got %q\nwant %q...", tc.url, args, r.stderr, tc.want)
			assert.NotContains(t, r.stderr, "redigo:", "%s %v", tc.url, args)
			assert.NotContains(t, r.stderr, "s3cret", "no password in messages")
		}
	}
	// The good URLs still work, and a user that may not select uses db 0.
	for _, url := range []string{"redis://:s3cret@" + withPass.Addr + "/3", "redis://nosel:pw@" + plain.Addr} {
		e := &env{url: url, dir: t.TempDir()}
		r := e.run(t, "run", "x", "--", "true")
		assert.Equal(t, 0, r.code, "%s: %s", url, r.stderr)
	}
}
