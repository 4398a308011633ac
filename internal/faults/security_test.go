package faults

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// aclCommands are the commands redsem needs (admin.ACLCommands), as ACL
// rules "+cmd ...".
var aclCommands = "+" + strings.Join(admin.ACLCommands(), " +")

// aclLine is the least-privilege user for the default prefix.
func aclLine(user, pass, keys, cmds string) []interface{} {
	args := []interface{}{"SETUSER", user, "reset", "on", ">" + pass, "resetkeys", keys, "resetchannels", "-@all"}
	for _, c := range strings.Fields(cmds) {
		args = append(args, c)
	}
	return args
}

// The library runs as a least-privilege ACL user: only the commands it needs
// and only keys under redsem:*. Without the keys, or without BLMOVE, it fails
// with a clear NOPERM error.
func TestLeastPrivilegeACL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Do(t, "ACL", aclLine("redsem-app", "app-secret", "~redsem:*", aclCommands)...)
	srv.Do(t, "ACL", aclLine("redsem-otherkeys", "x", "~other:*", aclCommands)...)
	srv.Do(t, "ACL", aclLine("redsem-noblmove", "y", "~redsem:*", strings.Replace(aclCommands, "+blmove ", "", 1))...)
	line := "ACL SETUSER redsem-app on >****** resetkeys ~redsem:* resetchannels -@all " + aclCommands
	t.Logf("ACL line: %s", line)

	r := newRun(t, srv, 2, time.Second, 300*time.Millisecond, "-user", "redsem-app", "-password", "app-secret")
	for i := 0; i < 4; i++ {
		r.spawn("-dur", "3s", "-holdmin", "10ms", "-holdmax", "60ms", "-strandp", "0.05")
	}
	r.waitAll(30 * time.Second)
	rep := r.check(history.Options{})
	app := srv.Pool(t, redis.DialUsername("redsem-app"), redis.DialPassword("app-secret"))
	sem, err := redsem.NewSemaphore(app, r.name, 2, redsem.WithTTL(time.Second), redsem.WithGrace(300*time.Millisecond))
	require.NoError(t, err)
	_, lost, _ := quiesce(t, opsFor(t, app, r.name), sem, 15*time.Second)
	ctx := ctxT(t, 10*time.Second)
	assert.ErrorIs(t, admin.CheckServer(ctx, app), admin.ErrNotChecked, "CheckServer without INFO permission says it could not check")
	require.NoError(t, opsFor(t, app, r.name).Delete(ctx), "Delete as the ACL user")
	assert.Zero(t, dbsize(t, srv))
	t.Logf("as ACL user: %s; tokens lost=%d", rep.Summary(), lost)

	other := srv.Pool(t, redis.DialUsername("redsem-otherkeys"), redis.DialPassword("x"))
	osem, err := redsem.NewSemaphore(other, "denied", 1)
	require.NoError(t, err)
	_, err = osem.Acquire(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NOPERM", "a user without the keys")
	t.Logf("user without ~redsem:* -> %v", err)
	assert.Zero(t, dbsize(t, srv))

	// Without BLMOVE the fast path works; waiting fails clearly.
	nob := srv.Pool(t, redis.DialUsername("redsem-noblmove"), redis.DialPassword("y"))
	nsem, err := redsem.NewSemaphore(nob, "noblmove", 1)
	require.NoError(t, err)
	l, err := nsem.Acquire(ctx)
	require.NoError(t, err, "the fast path needs no BLMOVE")
	bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = nsem.Acquire(bctx)
	ended := bctx.Err()
	cancel()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NOPERM", "a user without BLMOVE")
	assert.NoError(t, ended, "NOPERM should fail at once, not wait for the context")
	t.Logf("user without BLMOVE, blocking Acquire -> %v", err)
	require.NoError(t, l.Release(ctx))
}

// AUTH with a password through redigo's DialPassword.
func TestAuthPassword(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Do(t, "CONFIG", "SET", "requirepass", "s3cret-pw")
	r := newRun(t, srv, 2, time.Second, 300*time.Millisecond, "-password", "s3cret-pw")
	for i := 0; i < 3; i++ {
		r.spawn("-dur", "2s", "-holdmin", "10ms", "-holdmax", "60ms")
	}
	r.waitAll(30 * time.Second)
	rep := r.check(history.Options{})
	ctx := ctxT(t, 10*time.Second)
	authed := srv.Pool(t, redis.DialPassword("s3cret-pw"))
	sem, err := redsem.NewSemaphore(authed, r.name, 2)
	require.NoError(t, err)
	_, lost, _ := quiesce(t, opsFor(t, authed, r.name), sem, 15*time.Second)
	t.Logf("with AUTH: %s; tokens lost=%d", rep.Summary(), lost)

	for _, pw := range []string{"", "wrong"} {
		opts := []redis.DialOption{}
		if pw != "" {
			opts = append(opts, redis.DialPassword(pw))
		}
		bad, err := redsem.NewSemaphore(srv.Pool(t, opts...), r.name, 2)
		require.NoError(t, err)
		_, err = bad.Acquire(ctx)
		require.Error(t, err)
		// Without a password Redis answers the library's first command (an
		// EVALSHA of more than 10 arguments) with a protocol error rather
		// than NOAUTH: unauthenticated clients may not send longer commands.
		assert.True(t, strings.Contains(err.Error(), "NOAUTH") || strings.Contains(err.Error(), "WRONGPASS") ||
			strings.Contains(err.Error(), "unauthenticated"), "%v", err)
		t.Logf("password %q -> %v", pw, err)
	}
}

// TLS with a self-signed CA generated here, through redigo's DialUseTLS and
// DialTLSConfig.
func TestTLS(t *testing.T) {
	t.Parallel()
	certs := redistest.NewTLS(t)
	caFile, certFile, keyFile := certs.CAFile, certs.CertFile, certs.KeyFile
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tlsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	srv := redistest.Start(t, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	tlsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	r := newRun(t, srv, 2, time.Second, 300*time.Millisecond, "-addr", tlsAddr, "-tlsca", caFile)
	for i := 0; i < 3; i++ {
		r.spawn("-dur", "2s", "-holdmin", "10ms", "-holdmax", "60ms")
	}
	r.waitAll(30 * time.Second)
	rep := r.check(history.Options{})

	dial := func(opts ...redis.DialOption) *redis.Pool {
		p := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", tlsAddr, append([]redis.DialOption{redis.DialConnectTimeout(2 * time.Second), redis.DialReadTimeout(2 * time.Second)}, opts...)...)
		}}
		t.Cleanup(func() { p.Close() })
		return p
	}
	good := dial(redis.DialUseTLS(true), redis.DialTLSConfig(certs.Config))
	sem, err := redsem.NewSemaphore(good, r.name, 2)
	require.NoError(t, err)
	_, lost, _ := quiesce(t, opsFor(t, good, r.name), sem, 15*time.Second)
	t.Logf("over TLS: %s; tokens lost=%d", rep.Summary(), lost)

	ctx := ctxT(t, 10*time.Second)
	for what, p := range map[string]*redis.Pool{
		"TLS without the CA": dial(redis.DialUseTLS(true)),
		"plain TCP":          dial(),
	} {
		s, err := redsem.NewSemaphore(p, r.name, 2)
		require.NoError(t, err)
		_, err = s.TryAcquire(ctx)
		assert.Error(t, err, what)
		t.Logf("%s to the TLS port -> %v", what, err)
	}
}
