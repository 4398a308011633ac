package engine

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"
)

// How redsem calls a script: declared once (NewScript, the registry below), its
// arguments named as its header names them (Args), checked before anything
// is sent (checkArity), and run (RunScript on a connection, Call on a pool).

// The registry: every script redsem runs, declared here and nowhere else,
// each as its file in lua/, the number of keys it takes (named on its
// "-- KEYS:" header line) and the helpers it runs after. Its arguments are
// named on its "-- ARGV:" header, and every call names them the same way
// (Args): RunScript refuses a call whose names or count differ before
// anything is sent (ErrArity). Its replies start with a code named in
// codes.lua.
// TestScriptHeadersMatchDeclarations holds each declaration against its
// headers, and every file in lua/ is an entry script here or a helper of
// one, never both.
var (
	// The semaphore's (and mutex's). A *_fast.lua helper is a fast path:
	// it runs before the other helpers are defined and serves the common
	// case itself, as the rest of its script would
	// (TestFastPathsMatchSlowPaths).
	Acquire = NewScript(6, "acquire.lua", with([]string{"fast.lua", "acquire_fast.lua"}, semaphore)...)
	// A waiter's registration written with its wait (oneToken.Queue),
	// always sent with its source.
	Register = NewScript(3, "register.lua")
	Release  = NewScript(4, "release.lua", with([]string{"fast.lua", "release_fast.lua"}, semaphore, weighted)...)
	Refresh  = NewScript(4, "refresh.lua", semaphore...)
	Abort    = NewScript(6, "abort.lua", semaphore...)
	Reclaim  = NewScript(5, "reclaim.lua", semaphore...)
	Status   = NewScript(5, "status.lua")
	Resize   = NewScript(5, "resize.lua", semaphore...)
	Check    = NewScript(5, "check.lua", with(semaphore, []string{"inventory.lua"})...)
	Repair   = NewScript(5, "repair.lua", with(semaphore, []string{"inventory.lua"})...)
	AcquireN = NewScript(8, "acquire_n.lua", with(semaphore, weighted)...)
	AbortN   = NewScript(8, "abort_n.lua", with(semaphore, weighted)...)

	// The read-write lock's.
	RWAcquire = NewScript(6, "rw_acquire.lua", "base.lua", "rw_common.lua")
	RWAbort   = NewScript(6, "rw_abort.lua", "base.lua", "rw_common.lua")
	RWRelease = NewScript(5, "rw_release.lua", "base.lua", "rw_common.lua")
	RWRefresh = NewScript(5, "rw_refresh.lua", "base.lua", "rw_common.lua")

	// The election's, beside the keys of its mutex.
	Election        = NewScript(6, "election.lua", "base.lua", "election_common.lua")
	ElectionObserve = NewScript(7, "election_observe.lua", "base.lua", "election_common.lua")

	// The rate gate's (package rate): RateKeys keys for a start, its state
	// keys (RateStateKeys) for the others.
	RateTake   = NewScript(RateKeys, "rate_take.lua", rate...)
	RateAbort  = NewScript(RateKeys, "rate_abort.lua", rate...)
	RateSet    = NewScript(RateStateKeys, "rate_set.lua", rate...)
	RateStatus = NewScript(RateStateKeys, "rate_status.lua", rate...)
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

// scriptsFS holds every declared script as Redis runs it, one file each:
// scripts/<file> is lua/<file>'s header, then codes.lua and its helpers,
// then the rest of lua/<file>, resolved by go generate
// (TestScriptsGenerated fails while one differs from its parts).
//
//go:embed scripts/*.lua
var scriptsFS embed.FS

// NewScript returns the script scripts/<file> taking keys keys: lua/<file>
// run after codes.lua and the helper files it names (Redis scripts cannot
// import one another), resolved into one file by go generate. Its
// "-- ARGV:" header names its arguments: a call whose arguments differ is
// refused before anything is sent (ErrArity).
func NewScript(keys int, file string, helpers ...string) *Script {
	helpers = append([]string{"codes.lua"}, helpers...)
	d := Declaration{File: file, Keys: keys, Helpers: helpers, MinArgs: -1}
	b, _ := scriptsFS.ReadFile("scripts/" + file) // none yet: TestScriptsGenerated writes it
	d.src = string(b)
	if h, err := argHeader(file, d.src); err == nil {
		d.MinArgs, d.MaxArgs, d.args = h.Required, len(h.Names), h
		if h.Rest {
			d.MaxArgs = Variadic
		}
	}
	script := Lua(keys, d.src)
	script.decl = &d
	declMu.Lock()
	declared = append(declared, d)
	declMu.Unlock()
	return script
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

// Variadic is Declaration.MaxArgs for a script whose arguments end in a
// list of any length.
const Variadic = 1 << 20

// ErrArity is a call of a script with more or fewer arguments than its
// "-- ARGV:" header lists: a bug in redsem, never sent to Redis.
var ErrArity = errors.New("redsem: internal error: script called with the wrong number of arguments")

// checkArity returns ErrArity, wrapped with the script and the counts, when
// keysAndArgs does not fit script's declaration.
func checkArity(script *Script, keysAndArgs []interface{}) error {
	var d Declaration
	if script.decl != nil {
		d = *script.decl
	}
	if n := len(keysAndArgs); n > 0 {
		if bad, isBad := keysAndArgs[n-1].(badArgs); isBad {
			return fmt.Errorf("%w: %s: %s", ErrArity, d.File, bad.why)
		}
	}
	if script.decl == nil || d.MinArgs < 0 {
		return nil
	}
	if n := len(keysAndArgs) - d.Keys; n < d.MinArgs || n > d.MaxArgs {
		return fmt.Errorf("%w: %s takes %d keys and %s arguments, called with %d values",
			ErrArity, d.File, d.Keys, d.argRange(), len(keysAndArgs))
	}
	return nil
}

func (d Declaration) argRange() string {
	switch {
	case d.MaxArgs == Variadic:
		return fmt.Sprintf("%d or more", d.MinArgs)
	case d.MaxArgs != d.MinArgs:
		return fmt.Sprintf("%d to %d", d.MinArgs, d.MaxArgs)
	}
	return fmt.Sprint(d.MinArgs)
}

// Declaration is a script as Go declares it: its file, how many of its
// arguments are keys, and the helper files it runs after; and how many
// other arguments it takes by its header (MinArgs -1: the header could not
// be read, which TestScriptHeadersMatchDeclarations reports).
type Declaration struct {
	File             string
	Keys             int
	Helpers          []string
	MinArgs, MaxArgs int
	args             ArgHeader
	src              string // as sent with EVAL
}

var (
	declMu   sync.Mutex
	declared []Declaration
)

// Arg is one argument of a script call, under the name the script's
// "-- ARGV:" header gives it.
type Arg struct {
	Name  string
	Value interface{}
}

// A is the argument name = v.
func A(name string, v interface{}) Arg { return Arg{Name: name, Value: v} }

// Rest is what follows the named arguments of a script whose header ends in
// a "then ..." item (the other tokens of a lease, a limit's values): any
// number of values, spread after the named ones.
func Rest(vs ...interface{}) Arg { return Arg{Name: restName, Value: vs} }

// RestStrings is Rest of strings.
func RestStrings(vs []string) Arg {
	out := make([]interface{}, len(vs))
	for i, v := range vs {
		out[i] = v
	}
	return Rest(out...)
}

const restName = "then ..."

// badArgs ends the keys and arguments Args built for a call whose names are
// not its script's: RunScript, Call and BlockThenRun refuse such a call
// before anything is sent (ErrArity).
type badArgs struct{ why string }

// Args returns the keys and arguments of a call of script: keys, then the
// value of each argument. The arguments must be named as the script's
// "-- ARGV:" header names them, in its order: all of the required ones, of
// the optional ones any first few, then Rest if the header has a "then"
// item. A call named otherwise is refused before anything is sent, with
// ErrArity saying which name differs; so the Go side of every call states
// each argument by name and cannot shift one against the script.
func Args(script *Script, keys []interface{}, args ...Arg) []interface{} {
	var d Declaration
	ok := script.decl != nil
	if ok {
		d = *script.decl
	}
	out := make([]interface{}, 0, len(keys)+len(args)+4)
	out = append(out, keys...)
	var bad string
	refuse := func(format string, v ...interface{}) {
		if ok && bad == "" {
			bad = fmt.Sprintf(format, v...)
		}
	}
	i := 0
	for j, a := range args {
		if a.Name == restName {
			switch {
			case !d.args.Rest:
				refuse("values after its arguments, which its header does not take")
			case j != len(args)-1:
				refuse("values before its argument %q", args[j+1].Name)
			}
			out = append(out, a.Value.([]interface{})...)
			continue
		}
		switch {
		case i >= len(d.args.Names):
			refuse("argument %q after its %d", a.Name, len(d.args.Names))
		case d.args.Names[i] != a.Name:
			refuse("argument %d is %q, called as %q", i+1, d.args.Names[i], a.Name)
		}
		i++
		out = append(out, a.Value)
	}
	if i < d.args.Required {
		refuse("argument %q left out", d.args.Names[i])
	}
	if bad != "" {
		out = append(out, badArgs{bad})
	}
	return out
}

// Pool is where the scripts' connections come from; redsem.Pool and
// rate.Pool have this method set.
type Pool interface {
	GetContext(ctx context.Context) (redis.Conn, error)
}

// RunScript runs script on conn under ctx. A context that can never end
// needs no watcher goroutine, so the plain call is used then, and one that
// ends only at its deadline (Within) reads with that timeout instead.
func RunScript(ctx context.Context, conn redis.Conn, script *Script, keysAndArgs ...interface{}) (interface{}, error) {
	if err := checkArity(script, keysAndArgs); err != nil {
		return nil, err
	}
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

// Call runs script on a connection from pool. A pooled connection may be
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
func Call(ctx context.Context, pool Pool, script *Script, keysAndArgs ...interface{}) (v interface{}, retried bool, err error) {
	for attempt := 0; ; attempt++ {
		var conn redis.Conn
		conn, err = pool.GetContext(ctx)
		if err != nil {
			return nil, retried, err
		}
		v, err = RunScript(ctx, conn, script, keysAndArgs...)
		conn.Close()
		if err == nil || IsRedisError(err) || errors.Is(err, ErrArity) || NotSent(err) || CtxErr(ctx) != nil {
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
