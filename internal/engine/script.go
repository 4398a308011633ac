package engine

import (
	"context"
	"embed"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"
)

// How redsem calls a script: declared once with the type of its arguments
// (NewScript, the registry below), called with a value of that type (With),
// and run (RunScript on a connection, Call on a pool) by EVALSHA (Script).

// The registry: every script redsem runs, declared here and nowhere else,
// each as its file in lua/, the number of keys it takes (named on its
// "-- KEYS:" header line), the helpers it runs after and the type of its
// arguments, whose fields are the names on its "-- ARGV:" header (args.go).
// Its replies start with a code named in codes.lua.
// TestScriptHeadersMatchDeclarations holds each declaration against its
// headers, and every file in lua/ is an entry script here or a helper of
// one, never both.
var (
	// The semaphore's (and mutex's). A *_fast.lua helper is a fast path:
	// it runs before the other helpers are defined and serves the common
	// case itself, as the rest of its script would
	// (TestFastPathsMatchSlowPaths); what the two write alike (a lease's
	// record and its fence) is written once, before the fast path's loop.
	Acquire = NewScript[AcquireArgs](6, "acquire.lua", with([]string{"fast.lua", "acquire_fast.lua"}, semaphore)...)
	// A waiter's registration written with its wait (oneToken.Queue),
	// always sent with its source.
	Register = NewScript[RegisterArgs](3, "register.lua")
	Release  = NewScript[ReleaseArgs](4, "release.lua", with([]string{"fast.lua", "release_fast.lua"}, semaphore, weighted)...)
	Refresh  = NewScript[RefreshArgs](4, "refresh.lua", semaphore...)
	Abort    = NewScript[AbortArgs](6, "abort.lua", semaphore...)
	Reclaim  = NewScript[ReclaimArgs](5, "reclaim.lua", semaphore...)
	Status   = NewScript[NoArgs](5, "status.lua")
	Resize   = NewScript[ResizeArgs](5, "resize.lua", semaphore...)
	Check    = NewScript[NoArgs](5, "check.lua", with(semaphore, []string{"inventory.lua"})...)
	Repair   = NewScript[NoArgs](5, "repair.lua", with(semaphore, []string{"inventory.lua"})...)
	AcquireN = NewScript[AcquireNArgs](8, "acquire_n.lua", with(semaphore, weighted)...)
	AbortN   = NewScript[AbortNArgs](8, "abort_n.lua", with(semaphore, weighted)...)

	// The read-write lock's.
	RWAcquire = NewScript[RWAcquireArgs](6, "rw_acquire.lua", "base.lua", "rw_common.lua")
	RWAbort   = NewScript[RWAbortArgs](6, "rw_abort.lua", "base.lua", "rw_common.lua")
	RWRelease = NewScript[ReleaseArgs](5, "rw_release.lua", "base.lua", "rw_common.lua")
	RWRefresh = NewScript[RefreshArgs](5, "rw_refresh.lua", "base.lua", "rw_common.lua")

	// The election's, beside the keys of its mutex.
	Election        = NewScript[ElectionArgs](6, "election.lua", "base.lua", "election_common.lua")
	ElectionObserve = NewScript[ObserveArgs](7, "election_observe.lua", "base.lua", "election_common.lua")

	// The rate gate's (package rate): RateKeys keys for a start, its state
	// keys (RateStateKeys) for the others.
	RateTake   = NewScript[RateTakeArgs](RateKeys, "rate_take.lua", rate...)
	RateAbort  = NewScript[RateAbortArgs](RateKeys, "rate_abort.lua", rate...)
	RateSet    = NewScript[RateSetArgs](RateStateKeys, "rate_set.lua", rate...)
	RateStatus = NewScript[NoArgs](RateStateKeys, "rate_status.lua", rate...)
)

// The helper files scripts share, in the order they run.
var (
	semaphore = []string{"base.lua", "meta.lua", "idle.lua", "tokens.lua", "sweep.lua"}
	weighted  = []string{"weighted.lua"}
	rate      = []string{"base.lua", "rate_common.lua", "rate_window.lua", "rate_idle.lua"}
)

func with(lists ...[]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

//go:generate go test -count=1 -run ^TestScriptsGenerated$ . -args -write

// scriptsFS holds every declared script as Redis runs it (but for its
// comment lines, which wire empties), one file each:
// scripts/<file> is lua/<file>'s header, then codes.lua and its helpers,
// then the rest of lua/<file>, resolved by go generate
// (TestScriptsGenerated fails while one differs from its parts).
//
//go:embed scripts/*.lua
var scriptsFS embed.FS

// NewScript returns the script scripts/<file> taking keys keys and the
// fields of A as its arguments: lua/<file> run after codes.lua and the
// helper files it names (Redis scripts cannot import one another),
// resolved into one file by go generate.
func NewScript[A any](keys int, file string, helpers ...string) Declared[A] {
	helpers = append([]string{"codes.lua"}, helpers...)
	d := Declaration{File: file, Keys: keys, Helpers: helpers, Args: reflect.TypeFor[A]()}
	b, _ := scriptsFS.ReadFile("scripts/" + file) // none yet: TestScriptsGenerated writes it
	d.src = wire(string(b))
	if h, err := argHeader(file, string(b)); err == nil {
		d.required = h.Required
	}
	script := Lua(keys, d.src)
	script.decl = &d
	declMu.Lock()
	declared = append(declared, d)
	declMu.Unlock()
	return Declared[A]{script}
}

// wire is a script's source as redsem sends it: the committed file with
// every line that is only a comment emptied, so that an EVAL (register.lua
// on every queued wait, any script after NOSCRIPT) carries the code and
// not its prose, and a Lua error's line number is still the file's. The
// scripts have no long brackets (TestLuaShape), so a line that starts with
// "--" is a comment.
func wire(src string) string {
	lines := strings.Split(src, "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimLeft(l, " \t"), "--") {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// Declared is a script NewScript declared, called with arguments of type A.
// Tests may swap its Script for another version of it (the explorer's
// planted bugs).
type Declared[A any] struct{ *Script }

// With is the call of the script on keys with args: each field of args in
// order, a slice last spread; the header's optional fields, from the last,
// are left out while zero (each argument costs Redis time on every call).
func (d Declared[A]) With(keys []interface{}, args A) Run {
	v := reflect.ValueOf(args)
	n := v.NumField()
	out := make([]interface{}, 0, len(keys)+n+4)
	out = append(out, keys...)
	required := n
	if d.decl != nil {
		required = d.decl.required
	}
	for n > required && v.Field(n-1).Kind() != reflect.Slice && v.Field(n-1).IsZero() {
		n--
	}
	for i := 0; i < n; i++ {
		f := v.Field(i)
		if f.Kind() != reflect.Slice {
			out = append(out, f.Interface())
			continue
		}
		for j := 0; j < f.Len(); j++ {
			out = append(out, f.Index(j).Interface())
		}
	}
	return Run{Script: d.Script, KeysAndArgs: out}
}

// Run is one call of a script: the script, then its keys and arguments as
// it takes them.
type Run struct {
	Script      *Script
	KeysAndArgs []interface{}
}

// With is a call of s on keysAndArgs as given: for a script no registry
// declares (Lua), or a test's forged arguments.
func (s *Script) With(keysAndArgs ...interface{}) Run {
	return Run{Script: s, KeysAndArgs: keysAndArgs}
}

// Source returns the declared script scripts/<file> as Redis runs it; it
// panics when no script is declared so.
func Source(file string) string {
	declMu.Lock()
	defer declMu.Unlock()
	for _, d := range declared {
		if d.File == file {
			return d.src
		}
	}
	panic("redsem: no script declared as " + file)
}

// Declaration is a script as Go declares it: its file, how many of its
// arguments are keys, the helper files it runs after and the type of its
// other arguments.
type Declaration struct {
	File     string
	Keys     int
	Helpers  []string
	Args     reflect.Type
	required int    // the fields With always sends: before the header's optional ones
	src      string // as sent with EVAL
}

var (
	declMu   sync.Mutex
	declared []Declaration
)

// Pool is where the scripts' connections come from; redsem.Pool and
// rate.Pool have this method set.
type Pool interface {
	GetContext(ctx context.Context) (redis.Conn, error)
}

// RunScript runs r on conn under ctx. A context that can never end needs
// no watcher goroutine, so the plain call is used then, and one that ends
// only at its deadline (Within) reads with that timeout instead.
func RunScript(ctx context.Context, conn redis.Conn, r Run) (interface{}, error) {
	script, keysAndArgs := r.Script, r.KeysAndArgs
	if ctx.Done() == nil {
		return script.Do(conn, keysAndArgs...)
	}
	if _, ok := ctx.(deadlineOnly); ok {
		dl, _ := ctx.Deadline()
		return script.DoUntil(conn, dl, keysAndArgs...)
	}
	return script.DoContext(ctx, conn, keysAndArgs...)
}

// Within is parent without its cancellation, ending d from now. Scripts run
// under it with a read timeout, without the watcher goroutine a context
// that may end otherwise needs: one goroutine switch less per call (a
// Release's, on the handoff chain).
func Within(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), d)
	return deadlineOnly{ctx}, cancel
}

// deadlineOnly is a context that ends at its deadline and never before.
type deadlineOnly struct{ context.Context }

// Call runs r on a connection from pool. A pooled connection may be
// dead (killed by CLIENT KILL, cut by a proxy, or from before a server
// restart) and fail on first use, and so may every other idle connection of
// the pool. So when an attempt fails on the connection and ctx is still
// live, Call runs the script again on the next one: after the first such
// failure once more whatever the error, and then as long as each connection
// fails the way a dead one does at once (EOF, reset, broken pipe, closed),
// which drains the pool's dead connections until a live one or a fresh dial
// answers (at most MaxDeadConns attempts). It reports retried when an
// attempt failed after the script may have been sent. A dial that fails
// (nothing sent: Redis unreachable) ends Call at once, without a retry. Only
// idempotent scripts go through Call; whether an earlier attempt took effect
// is for the caller to judge.
func Call(ctx context.Context, pool Pool, r Run) (v interface{}, retried bool, err error) {
	for attempt := 0; ; attempt++ {
		var conn redis.Conn
		conn, err = pool.GetContext(ctx)
		if err != nil {
			return nil, retried, err
		}
		v, err = RunScript(ctx, conn, r)
		conn.Close()
		if err == nil || IsRedisError(err) || NotSent(err) || CtxErr(ctx) != nil {
			return v, retried, err
		}
		if attempt >= MaxDeadConns || (attempt >= 1 && !DeadConn(err)) {
			return v, true, err
		}
		retried = true
	}
}

// MaxDeadConns bounds the attempts Call makes past the first when each
// fails on a dead pooled connection: more than the idle connections of any
// reasonable pool.
const MaxDeadConns = 256

// DeadConn reports whether err is how a connection the server (or
// something between) has closed fails on its first use: at once, before
// any reply, with nothing run. Another connection may well work.
func DeadConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, net.ErrClosed)
}

// NotSent reports whether err says a command never left this process: the
// connection it needed could not be opened (a failed dial: refused,
// unreachable, a TLS handshake that failed). redigo pools dial in
// GetContext; a pool that dials lazily (the goredis module) reports the
// dial's error from the command instead, and nothing is then in doubt.
func NotSent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// IsRedisError reports whether err is an error reply from Redis (the
// connection is fine) rather than a network or context error.
func IsRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// CtxErr is ctx.Err(), or context.DeadlineExceeded once the deadline has
// passed even if ctx's timer has not fired yet (a dial or read with the same
// deadline can fail first).
func CtxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

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
// count before them), declared nowhere: its arguments are sent as given.
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
