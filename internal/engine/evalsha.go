package engine

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Script is a Lua script as redsem runs it: by EVALSHA, and by EVAL when
// the server answers NOSCRIPT (a fresh, restarted or flushed server),
// which loads it there. Its hash is the one Redis gives: learnt by SCRIPT
// LOAD before its first run, then kept. The client never computes a
// SHA-1, which Go's FIPS 140-only mode (GODEBUG=fips140=only) forbids.
type Script struct {
	keys int // < 0: the caller passes the key count first
	src  string
	hash atomic.Pointer[string]
	decl *Declaration // nil: not declared by NewScript (Lua)
}

// Lua returns the script src taking keys keys (-1: the caller passes the
// count before them), declared nowhere: no arity check.
func Lua(keys int, src string) *Script { return &Script{keys: keys, src: src} }

// Src is the script's source, as EVAL sends it.
func (s *Script) Src() string { return s.src }

// Hash is the script's hash as Redis reported it, "" until one did.
func (s *Script) Hash() string {
	if h := s.hash.Load(); h != nil {
		return *h
	}
	return ""
}

// Load loads the script on the server of conn (SCRIPT LOAD) and keeps the
// hash that server reports.
func (s *Script) Load(conn redis.Conn) error {
	_, err := s.load(conn.Do)
	return err
}

// DoContext runs the script on conn under ctx (see Script).
func (s *Script) DoContext(ctx context.Context, conn redis.Conn, keysAndArgs ...interface{}) (interface{}, error) {
	return s.run(withCtx(ctx, conn), keysAndArgs)
}

// Do runs the script on conn (see Script).
func (s *Script) Do(conn redis.Conn, keysAndArgs ...interface{}) (interface{}, error) {
	return s.run(conn.Do, keysAndArgs)
}

// DoUntil runs the script on conn, each reply read by deadline (given 1ms
// at least).
func (s *Script) DoUntil(conn redis.Conn, deadline time.Time, keysAndArgs ...interface{}) (interface{}, error) {
	return s.run(func(cmd string, args ...interface{}) (interface{}, error) {
		return redis.DoWithTimeout(conn, max(time.Until(deadline), time.Millisecond), cmd, args...)
	}, keysAndArgs)
}

// hashOn is the script's hash, learnt by SCRIPT LOAD on conn under ctx if
// no server has reported it yet.
func (s *Script) hashOn(ctx context.Context, conn redis.Conn) (string, error) {
	return s.hashFor(withCtx(ctx, conn))
}

// do is how a Script sends one command: with a context, a timeout, or
// neither.
type do func(cmd string, args ...interface{}) (interface{}, error)

func withCtx(ctx context.Context, conn redis.Conn) do {
	return func(cmd string, args ...interface{}) (interface{}, error) {
		return redis.DoContext(conn, ctx, cmd, args...)
	}
}

func (s *Script) load(do do) (string, error) {
	h, err := redis.String(do("SCRIPT", "LOAD", s.src))
	if err != nil {
		return "", err
	}
	s.hash.Store(&h)
	return h, nil
}

// hashFor is the script's hash, learnt by SCRIPT LOAD through do if no
// server has reported it yet.
func (s *Script) hashFor(do do) (string, error) {
	if h := s.Hash(); h != "" {
		return h, nil
	}
	return s.load(do)
}

func (s *Script) run(do do, keysAndArgs []interface{}) (interface{}, error) {
	h, err := s.hashFor(do)
	if err != nil {
		return nil, err
	}
	v, err := do("EVALSHA", s.args(h, keysAndArgs)...)
	if noScript(err) {
		v, err = do("EVAL", s.args(s.src, keysAndArgs)...)
	}
	return v, err
}

// args are EVALSHA's (spec the hash) or EVAL's (spec the source).
func (s *Script) args(spec string, keysAndArgs []interface{}) []interface{} {
	out := make([]interface{}, 0, 2+len(keysAndArgs))
	out = append(out, spec)
	if s.keys >= 0 {
		out = append(out, s.keys)
	}
	return append(out, keysAndArgs...)
}

// noScript reports whether err is Redis's NOSCRIPT reply: the script is
// not loaded on that server.
func noScript(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(string(re), "NOSCRIPT")
}
