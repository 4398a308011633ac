// Command worker is the client process of redsem's fault suite. It loops
// acquire, hold, release on one semaphore and appends every step to a shared
// history file (see ../history). Modes other than "lib" are deliberately
// broken clients that the history checker must catch.
//
// Exit codes: 0 done, 2 bad flags or constructor error, 3 fatal library error
// (wrong type, size mismatch, ...), 4 history or Redis bookkeeping failure.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/failpoint"
	"github.com/redsem/redsem/internal/faults/history"
)

var (
	addr      = flag.String("addr", "", "redis host:port")
	user      = flag.String("user", "", "ACL user name")
	password  = flag.String("password", "", "password (AUTH)")
	tlsCA     = flag.String("tlsca", "", "PEM file of the CA to trust; enables TLS")
	name      = flag.String("name", "faults", "semaphore name")
	nameHex   = flag.String("namehex", "", "semaphore name as hex bytes (overrides -name)")
	nameFile  = flag.String("namefile", "", "file holding the semaphore name (overrides -name and -namehex)")
	prefix    = flag.String("prefix", redsem.DefaultPrefix, "key prefix")
	size      = flag.Int("size", 2, "semaphore size")
	ttl       = flag.Duration("ttl", time.Second, "lease TTL")
	grace     = flag.Duration("grace", 300*time.Millisecond, "pending grace")
	histPath  = flag.String("hist", "", "history file")
	id        = flag.Int("id", 0, "worker id")
	iters     = flag.Int("iters", 0, "acquisitions to make (0: until -dur)")
	dur       = flag.Duration("dur", 5*time.Second, "stop starting acquisitions after this")
	holdMin   = flag.Duration("holdmin", 5*time.Millisecond, "shortest hold")
	holdMax   = flag.Duration("holdmax", 30*time.Millisecond, "longest hold")
	gapMax    = flag.Duration("gapmax", 10*time.Millisecond, "longest pause between holds")
	acqTO     = flag.Duration("acqtimeout", 20*time.Second, "context timeout of one Acquire")
	storm     = flag.Bool("storm", false, "cancel most Acquires on purpose after 1..stormmax")
	stormMax  = flag.Duration("stormmax", 40*time.Millisecond, "longest life of a storm Acquire")
	strandP   = flag.Float64("strandp", 0, "probability to skip the lease script behind a BLMOVE and kill -9 itself once the move returned")
	rto       = flag.Duration("rto", 0, "read timeout of the library's connections (0: none)")
	histName  = flag.Bool("histname", false, "CLIENT SETNAME the bookkeeping connection to 'hist'")
	mode      = flag.String("mode", "lib", "lib | mut-norelcheck | mut-reclaim | mut-rawpop | oneshot")
	staleP    = flag.Float64("stalep", 0.3, "mut-norelcheck: probability of holding past the TTL")
	exitOnErr = flag.Bool("exitonerr", false, "exit (code 3) on the first Acquire error that is not a context error")
)

var (
	hw   *history.Writer
	pid  = os.Getpid()
	keys history.Keys
	mono = time.Now()
	book redis.Conn // bookkeeping connection: TIME and lease lookups
	seq  int
)

func main() {
	flag.Parse()
	if *addr == "" || *histPath == "" {
		fmt.Fprintln(os.Stderr, "worker: -addr and -hist are required")
		os.Exit(2)
	}
	semName := *name
	if *nameHex != "" {
		b, err := hex.DecodeString(*nameHex)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker: -namehex:", err)
			os.Exit(2)
		}
		semName = string(b)
	}
	if *nameFile != "" {
		b, err := os.ReadFile(*nameFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker: -namefile:", err)
			os.Exit(2)
		}
		semName = string(b)
	}
	var err error
	if hw, err = history.Open(*histPath); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(4)
	}
	keys = history.KeysFor(*prefix, semName)
	opts := dialOptions()
	pool := &dyingPool{Pool: &redis.Pool{
		MaxIdle: 8,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", *addr, append(opts, redis.DialReadTimeout(*rto))...)
		},
	}}
	defer pool.Close()

	sem, err := redsem.NewSemaphore(pool, semName, *size, redsem.WithPrefix(*prefix), redsem.WithTTL(*ttl),
		redsem.WithGrace(*grace), redsem.WithLabel(fmt.Sprintf("worker-%d:%d", *id, pid)))
	if err != nil {
		emit(history.Event{K: history.KFatal, Class: classify(err), Err: err.Error()})
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	if *strandP > 0 {
		failpoint.Set(func(point string) bool {
			if point == "wait.script" && rand.Float64() < *strandP {
				pool.die.Store(true)
				return true
			}
			return false
		})
	}
	if err := dialBook(); err != nil {
		fmt.Fprintln(os.Stderr, "worker: bookkeeping connection:", err)
		os.Exit(4)
	}
	switch *mode {
	case "lib", "mut-norelcheck":
		os.Exit(loop(sem))
	case "mut-rawpop":
		os.Exit(rawPopLoop())
	case "mut-reclaim":
		os.Exit(rogueReclaimer())
	case "oneshot":
		os.Exit(oneshot(sem))
	}
	fmt.Fprintln(os.Stderr, "worker: unknown -mode", *mode)
	os.Exit(2)
}

func dialOptions() []redis.DialOption {
	opts := []redis.DialOption{redis.DialConnectTimeout(2 * time.Second)}
	if *user != "" {
		opts = append(opts, redis.DialUsername(*user))
	}
	if *password != "" {
		opts = append(opts, redis.DialPassword(*password))
	}
	if *tlsCA != "" {
		pem, err := os.ReadFile(*tlsCA)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker: -tlsca:", err)
			os.Exit(2)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			fmt.Fprintln(os.Stderr, "worker: -tlsca: no certificate")
			os.Exit(2)
		}
		opts = append(opts, redis.DialUseTLS(true), redis.DialTLSConfig(&tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12}))
	}
	return opts
}

// dyingPool kills the process on the first connection asked for after the
// strand failpoint skipped a lease script: that request comes from the
// library settling the skipped wait, after its BLMOVE returned, so the token
// (if one was moved) is left in the pending list with no lease.
type dyingPool struct {
	*redis.Pool
	die atomic.Bool
}

func (p *dyingPool) GetContext(ctx context.Context) (redis.Conn, error) {
	if p.die.Load() {
		emit(history.Event{K: history.KFPKill})
		_ = syscall.Kill(pid, syscall.SIGKILL)
		select {}
	}
	return p.Pool.GetContext(ctx)
}

func emit(e history.Event) {
	e.W, e.Pid = *id, pid
	e.Mono = time.Since(mono).Microseconds()
	if err := hw.Write(e); err != nil {
		fmt.Fprintln(os.Stderr, "worker: history:", err)
		os.Exit(4)
	}
}

func dialBook() error {
	c, err := redis.Dial("tcp", *addr, dialOptions()...)
	if err != nil {
		return err
	}
	if *histName {
		if _, err := c.Do("CLIENT", "SETNAME", "hist"); err != nil {
			c.Close()
			return err
		}
	}
	book = c
	return nil
}

// bookDo runs a bookkeeping command, redialling for up to 15s: the tests kill
// connections and restart the server under it.
func bookDo(cmd string, args ...interface{}) (interface{}, error) {
	var err error
	for i := 0; i < 150; i++ {
		if book == nil {
			if err = dialBook(); err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
		}
		var v interface{}
		v, err = book.Do(cmd, args...)
		if err == nil {
			return v, nil
		}
		var re redis.Error
		if errors.As(err, &re) && !strings.HasPrefix(string(re), "LOADING") {
			return nil, err
		}
		book.Close()
		book = nil
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

func serverTime() int64 {
	v, err := redis.Int64s(bookDo("TIME"))
	if err != nil || len(v) != 2 {
		fmt.Fprintln(os.Stderr, "worker: TIME:", err)
		os.Exit(4)
	}
	return v[0]*1_000_000 + v[1]
}

// leaseScript reads, in one step, Redis TIME and the lease deadline and fence
// Redis records for a token.
var leaseScript = redis.NewScript(2, `
local t = redis.call('TIME')
local dl = redis.call('ZSCORE', KEYS[1], ARGV[1])
local rec = redis.call('HGET', KEYS[2], 't:' .. ARGV[1])
return {t[1], t[2], dl or '', rec or ''}`)

// leaseInfo returns Redis TIME (µs) and the deadline (ms) of the lease with
// this fence on tok, or 0 when Redis records no such lease.
func leaseInfo(tok string, fence int64) (int64, int64) {
	for i := 0; ; i++ {
		v, err := redis.Strings(leaseScript.Do(bookConn(), keys.Leases, keys.Holders, tok))
		if err != nil || len(v) != 4 {
			if i < 150 {
				book.Close()
				book = nil
				time.Sleep(100 * time.Millisecond)
				continue
			}
			fmt.Fprintln(os.Stderr, "worker: lease info:", err)
			os.Exit(4)
		}
		s, _ := strconv.ParseInt(v[0], 10, 64)
		us, _ := strconv.ParseInt(v[1], 10, 64)
		now := s*1_000_000 + us
		parts := strings.Split(v[3], "|")
		if v[2] == "" || len(parts) < 2 || parts[1] != strconv.FormatInt(fence, 10) {
			return now, 0
		}
		dl, _ := strconv.ParseFloat(v[2], 64)
		return now, int64(dl)
	}
}

func bookConn() redis.Conn {
	for i := 0; book == nil && i < 150; i++ {
		if err := dialBook(); err != nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if book == nil {
		fmt.Fprintln(os.Stderr, "worker: no bookkeeping connection")
		os.Exit(4)
	}
	return book
}

func classify(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "ctx"
	case errors.Is(err, redsem.ErrLeaseLost):
		return "lost"
	case errors.Is(err, redsem.ErrReleased):
		return "released"
	case errors.Is(err, redsem.ErrLeaseExpired):
		return "expired"
	case errors.Is(err, redsem.ErrWrongType):
		return "wrongtype"
	case errors.Is(err, redsem.ErrSizeMismatch):
		return "size"
	case errors.Is(err, redsem.ErrCorrupt):
		return "corrupt"
	case errors.Is(err, redsem.ErrInvalidName):
		return "invalid-name"
	case errors.Is(err, redsem.ErrInvalidSize):
		return "invalid-size"
	case errors.Is(err, redsem.ErrInvalidTTL):
		return "invalid-ttl"
	case errors.Is(err, redsem.ErrInvalidOption):
		return "invalid-option"
	case errors.Is(err, redsem.ErrNoToken):
		return "notoken"
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "NOPERM"):
		return "noperm"
	case strings.Contains(msg, "OOM"):
		return "oom"
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"):
		return "auth"
	}
	return "conn"
}

func randDur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo)
}

// acquire runs one Acquire with this worker's context policy and records
// it. It returns nil when the attempt ended without a lease.
func acquire(sem *redsem.Semaphore) (*redsem.Lease, int64, bool) {
	t0 := serverTime()
	emit(history.Event{K: history.KWait, T0: t0})
	ctx, cancel := context.WithTimeout(context.Background(), *acqTO)
	defer cancel()
	intended := false
	if *storm && rand.IntN(4) != 0 {
		intended = true
		life := randDur(time.Millisecond, *stormMax)
		if rand.IntN(2) == 0 {
			ctx, cancel = context.WithTimeout(ctx, life)
			defer cancel()
		} else {
			var c context.CancelFunc
			ctx, c = context.WithCancel(ctx)
			defer c()
			t := time.AfterFunc(life, c)
			defer t.Stop()
		}
	}
	l, err := sem.Acquire(ctx)
	if err != nil {
		cl := classify(err)
		switch {
		case cl == "ctx" && intended:
			emit(history.Event{K: history.KCancel, Err: err.Error()})
		case cl == "ctx":
			emit(history.Event{K: history.KStarved, Err: err.Error()})
		case *exitOnErr || cl == "wrongtype" || cl == "size" || cl == "corrupt" || cl == "noperm":
			emit(history.Event{K: history.KFatal, Class: cl, Err: err.Error()})
			os.Exit(3)
		default:
			emit(history.Event{K: history.KAcqErr, Class: cl, Err: err.Error()})
			time.Sleep(20 * time.Millisecond)
		}
		return nil, t0, false
	}
	return l, t0, true
}

func loop(sem *redsem.Semaphore) int {
	end := time.Now().Add(*dur)
	for i := 0; (*iters == 0 || i < *iters) && time.Now().Before(end); {
		l, t0, ok := acquire(sem)
		if !ok {
			continue
		}
		i++
		seq++
		s := seq
		now, dl := leaseInfo(l.Token(), l.Fence())
		valid := l.Valid()
		emit(history.Event{K: history.KAcq, S: s, Tok: l.Token(), Fence: l.Fence(), T0: t0, T: now, DL: dl, Valid: valid})
		if valid {
			hold := randDur(*holdMin, *holdMax)
			if *mode == "mut-norelcheck" && rand.Float64() < *staleP {
				// The broken holder does not watch its lease either.
				time.Sleep(2**ttl + *ttl/2)
			} else {
				hold1(l, hold)
			}
		}
		tr := serverTime()
		v := l.Valid()
		emit(history.Event{K: history.KRelStart, S: s, Tok: l.Token(), Fence: l.Fence(), T: tr, Valid: v, Done: isDone(l)})
		var err error
		if *mode == "mut-norelcheck" {
			err = uncheckedRelease(l.Token())
		} else {
			err = release(l)
		}
		emit(history.Event{K: history.KRel, S: s, Tok: l.Token(), Fence: l.Fence(), Class: classify(err), Err: errString(err)})
		time.Sleep(randDur(0, *gapMax))
	}
	emit(history.Event{K: history.KExit})
	return 0
}

// hold keeps the lease for d, or until it ends. A holder that was frozen
// (SIGSTOP) past its deadline reports what it finds when it resumes.
func hold1(l *redsem.Lease, d time.Duration) {
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.Done():
	}
	if over := time.Since(start) - d; over > *ttl/2 || isDone(l) {
		// The lease ended under us, or we were stopped for a while: report
		// what the lease says now. Valid reads the clock; Done and Err
		// follow a timer that may fire a moment after a resume, so give
		// it 200ms.
		if !l.Valid() {
			select {
			case <-l.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		emit(history.Event{K: history.KRevived, Tok: l.Token(), Fence: l.Fence(), T: serverTime(),
			Valid: l.Valid(), Done: isDone(l), Class: classify(l.Err()), Err: strconv.FormatInt(over.Milliseconds(), 10) + "ms late"})
	}
}

func isDone(l *redsem.Lease) bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

// release releases the lease, retrying once after a connection error
// (Release is safe to repeat).
func release(l *redsem.Lease) error {
	var err error
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = l.Release(ctx)
		cancel()
		if err == nil || classify(err) != "conn" {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// uncheckedRelease is the broken release of mode mut-norelcheck: it frees
// the token whoever holds it now.
var uncheckedScript = redis.NewScript(3, `
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], 't:' .. ARGV[1])
redis.call('LPUSH', KEYS[1], ARGV[1])
return 1`)

func uncheckedRelease(tok string) error {
	_, err := uncheckedScript.Do(bookConn(), keys.Tokens, keys.Leases, keys.Holders, tok)
	return err
}

// rawPopLoop is the broken client of mode mut-rawpop: it takes tokens with
// BLPOP and records no lease, then pushes them back.
func rawPopLoop() int {
	c, err := redis.Dial("tcp", *addr, dialOptions()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 4
	}
	defer c.Close()
	end := time.Now().Add(*dur)
	for time.Now().Before(end) {
		t0 := serverTime()
		emit(history.Event{K: history.KWait, T0: t0})
		v, err := redis.Strings(c.Do("BLPOP", keys.Tokens, "0.5"))
		if err != nil || len(v) != 2 {
			continue
		}
		seq++
		tok := v[1]
		emit(history.Event{K: history.KAcq, S: seq, Tok: tok, T0: t0, T: serverTime(), Valid: true})
		time.Sleep(randDur(*holdMin, *holdMax))
		emit(history.Event{K: history.KRelStart, S: seq, Tok: tok, T: serverTime(), Valid: true})
		_, err = c.Do("LPUSH", keys.Tokens, tok)
		emit(history.Event{K: history.KRel, S: seq, Tok: tok, Class: classify(err)})
		time.Sleep(randDur(0, *gapMax))
	}
	emit(history.Event{K: history.KExit})
	return 0
}

// rogueReclaimer is the broken reclaimer of mode mut-reclaim: it gives back
// the tokens of every lease, expired or not.
var reclaimAllScript = redis.NewScript(3, `
local n = 0
for _, tok in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  redis.call('ZREM', KEYS[2], tok)
  redis.call('HDEL', KEYS[3], 't:' .. tok)
  redis.call('LPUSH', KEYS[1], tok)
  n = n + 1
end
return n`)

func rogueReclaimer() int {
	end := time.Now().Add(*dur)
	for time.Now().Before(end) {
		_, _ = reclaimAllScript.Do(bookConn(), keys.Tokens, keys.Leases, keys.Holders)
		time.Sleep(randDur(*holdMin, *holdMax))
	}
	emit(history.Event{K: history.KExit})
	return 0
}

// oneshot acquires once and releases, recording the outcome: for bad-input
// tests.
func oneshot(sem *redsem.Semaphore) int {
	ctx, cancel := context.WithTimeout(context.Background(), *acqTO)
	defer cancel()
	l, err := sem.Acquire(ctx)
	if err != nil {
		emit(history.Event{K: history.KFatal, Class: classify(err), Err: err.Error()})
		return 3
	}
	seq++
	now, dl := leaseInfo(l.Token(), l.Fence())
	emit(history.Event{K: history.KAcq, S: seq, Tok: l.Token(), Fence: l.Fence(), T: now, DL: dl, Valid: l.Valid()})
	time.Sleep(*holdMin)
	emit(history.Event{K: history.KRelStart, S: seq, Tok: l.Token(), Fence: l.Fence(), T: serverTime(), Valid: l.Valid()})
	err = release(l)
	emit(history.Event{K: history.KRel, S: seq, Tok: l.Token(), Fence: l.Fence(), Class: classify(err), Err: errString(err)})
	if err != nil {
		return 3
	}
	emit(history.Event{K: history.KExit})
	return 0
}
