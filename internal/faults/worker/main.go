// Command worker is the client process of redsem's fault suite. It loops
// acquire, hold, release on one semaphore and appends every step to a shared
// history file (see ../history). With -goroutines G it runs G such loops on
// one shared *Semaphore (shared waiting), each recording its own holds (the
// event's G field); with -weighted it takes k permits per hold with AcquireN
// and records all k tokens; with -rw it takes the read or the write side of
// an RWMutex of the name instead (a write with probability -writep). Modes
// other than "lib" are deliberately broken clients that the history checker
// must catch.
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/failpoint"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/sentinel"
)

var (
	addr      = flag.String("addr", "", "redis host:port")
	sentinels = flag.String("sentinels", "", "comma-separated sentinel host:port list: find the master through them (instead of -addr)")
	master    = flag.String("master", "m", "with -sentinels: the master's name")
	waitN     = flag.Int("wait", 0, "with -sentinels: WAIT for this many replicas after every write of the library (0: no WAIT)")
	waitTO    = flag.Duration("waittimeout", 200*time.Millisecond, "with -wait: the WAIT timeout")
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
	stopFile  = flag.String("stopfile", "", "also stop starting acquisitions once this file exists")
	holdMin   = flag.Duration("holdmin", 5*time.Millisecond, "shortest hold")
	holdMax   = flag.Duration("holdmax", 30*time.Millisecond, "longest hold")
	gapMax    = flag.Duration("gapmax", 10*time.Millisecond, "longest pause between holds")
	acqTO     = flag.Duration("acqtimeout", 20*time.Second, "context timeout of one Acquire")
	storm     = flag.Bool("storm", false, "cancel most Acquires on purpose after 1..stormmax")
	stormMax  = flag.Duration("stormmax", 40*time.Millisecond, "longest life of a storm Acquire")
	strandP   = flag.Float64("strandp", 0, "probability to skip the lease script behind a BLMOVE and kill -9 itself once the move returned")
	rto       = flag.Duration("rto", 0, "read timeout of the library's connections (0: none)")
	histName  = flag.Bool("histname", false, "CLIENT SETNAME the bookkeeping connection to 'hist'")
	mode      = flag.String("mode", "lib", "lib | mut-norelcheck | mut-reclaim | mut-rawpop | mut-wleak | mut-rwread | oneshot")
	rwFlag    = flag.Bool("rw", false, "take the sides of an RWMutex of the name instead of the semaphore's tokens")
	writeP    = flag.Float64("writep", 0.3, "with -rw: probability that a hold is a write")
	staleP    = flag.Float64("stalep", 0.3, "mut-norelcheck: probability of holding past the TTL")
	exitOnErr = flag.Bool("exitonerr", false, "exit (code 3) on the first Acquire error that is not a context error")
	nGor      = flag.Int("goroutines", 1, "goroutines looping acquire/hold/release on one shared *Semaphore")
	steady    = flag.Int("steady", 0, "with -storm: the first this many goroutines never cancel on purpose")
	waitConns = flag.Int("waitconns", -1, "WithWaitConnections (-1: the library's default)")
	weighted  = flag.String("weighted", "", "comma-separated permit counts, e.g. \"1,3\": each hold takes k of them with AcquireN, k drawn at random")
	nNames    = flag.Int("names", 0, "with n > 0: each hold takes a slot of one of n semaphores, <name>-0 .. <name>-(n-1), half the time one of the first 4 (contended), else any (mostly idle); events carry the name")
	idleExp   = flag.Duration("idle", 0, "WithIdleExpiry (0: off)")
	leakAfter = flag.Float64("leakafter", 0.3, "mut-wleak: fraction of the hold after which one token of a k-hold is freed raw")
)

// weights are the permit counts of -weighted (nil: Acquire).
var weights []int

// rwm is the lock of -rw (nil: the semaphore). Its holds are recorded with
// k = 1 for a write and 0 for a read, and their tokens say which
// ("<epoch>:w", "<epoch>:r"). The broken mode mut-rwread takes the read side
// for its writes and records them as writes.
var rwm *redsem.RWMutex

var (
	hw   *history.Writer
	pid  = os.Getpid()
	keys history.Keys
	mono = time.Now()
	// main0 is the worker's first actor: the only one unless -goroutines
	// asks for more, and the one the broken modes use.
	main0 = &actor{}
)

// actor is one goroutine that loops acquire, hold, release: its index in the
// process, its own bookkeeping connection (a redis.Conn is not for
// concurrent use) and its own acquisition count. A holder is identified in
// the history by pid and goroutine index.
type actor struct {
	g    int
	book redis.Conn // bookkeeping connection: TIME and lease lookups
	seq  int
	// With -names: the semaphore of the current hold, its name and keys.
	name string
	keys *history.Keys
}

// names are the semaphores of -names, made in main.
var names []namedSem

type namedSem struct {
	name string
	sem  *redsem.Semaphore
	keys history.Keys
}

// pick chooses the semaphore of a's next hold (-names), or returns sem.
func (a *actor) pick(sem *redsem.Semaphore) *redsem.Semaphore {
	if len(names) == 0 {
		return sem
	}
	i := rand.IntN(len(names))
	if rand.IntN(2) == 0 {
		i = rand.IntN(min(4, len(names)))
	}
	a.name, a.keys = names[i].name, &names[i].keys
	return names[i].sem
}

func main() {
	flag.Parse()
	if (*addr == "") == (*sentinels == "") || *histPath == "" {
		fmt.Fprintln(os.Stderr, "worker: -hist and one of -addr and -sentinels are required")
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
	if *sentinels != "" {
		pool.src, bookPool = sentinelPools()
		defer bookPool.Close()
	}
	defer pool.Close()

	if *weighted != "" {
		for _, f := range strings.Split(*weighted, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || k < 1 || k > *size {
				fmt.Fprintf(os.Stderr, "worker: -weighted: %q is not a permit count between 1 and %d\n", f, *size)
				os.Exit(2)
			}
			weights = append(weights, k)
		}
	}
	if *nGor < 1 {
		fmt.Fprintln(os.Stderr, "worker: -goroutines must be at least 1")
		os.Exit(2)
	}
	// Fixed leases: a worker's hold is bounded by the TTL, whatever it does.
	lockOpts := []redsem.Option{redsem.WithPrefix(*prefix), redsem.WithTTL(*ttl), redsem.WithFixedTTL(),
		redsem.WithGrace(*grace), redsem.WithLabel(fmt.Sprintf("worker-%d:%d", *id, pid))}
	semOpts := append([]redsem.Option(nil), lockOpts...)
	if *waitConns >= 0 {
		semOpts = append(semOpts, redsem.WithWaitConnections(*waitConns))
	}
	if *idleExp > 0 {
		semOpts = append(semOpts, redsem.WithIdleExpiry(*idleExp))
	}
	for i := 0; i < *nNames; i++ {
		n := fmt.Sprintf("%s-%d", semName, i)
		s, err := redsem.NewSemaphore(pool, n, *size, semOpts...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(2)
		}
		names = append(names, namedSem{name: n, sem: s, keys: history.KeysFor(*prefix, n)})
	}
	sem, err := redsem.NewSemaphore(pool, semName, *size, semOpts...)
	if err != nil {
		emit(history.Event{K: history.KFatal, Class: classify(err), Err: err.Error()})
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	if *rwFlag {
		rwm, err = redsem.NewRWMutex(pool, semName, lockOpts...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(2)
		}
		keys = history.RWKeysFor(*prefix, semName)
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
	if err := main0.dialBook(); err != nil {
		fmt.Fprintln(os.Stderr, "worker: bookkeeping connection:", err)
		os.Exit(4)
	}
	switch *mode {
	case "lib", "mut-norelcheck", "mut-wleak", "mut-rwread":
		os.Exit(runActors(sem))
	case "mut-rawpop":
		os.Exit(main0.rawPopLoop())
	case "mut-reclaim":
		os.Exit(main0.rogueReclaimer())
	case "oneshot":
		os.Exit(main0.oneshot(sem))
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
// (if one was moved) is left in the pending list with no lease. With
// -sentinels its connections come from src instead of Pool.
type dyingPool struct {
	*redis.Pool
	src interface {
		GetContext(context.Context) (redis.Conn, error)
		Close() error
	}
	die atomic.Bool
}

func (p *dyingPool) GetContext(ctx context.Context) (redis.Conn, error) {
	if p.die.Load() {
		emit(history.Event{K: history.KFPKill})
		_ = syscall.Kill(pid, syscall.SIGKILL)
		select {}
	}
	if p.src != nil {
		return p.src.GetContext(ctx)
	}
	return p.Pool.GetContext(ctx)
}

func (p *dyingPool) Close() error {
	if p.src != nil {
		p.src.Close()
	}
	return p.Pool.Close()
}

// bookPool, with -sentinels, gives the bookkeeping connections: to the
// master in use, without WAIT.
var bookPool *sentinel.Pool

// sentinelPools returns the library's pool (with WAIT when -wait asks for
// it) and the bookkeeping pool, both following the master through the
// sentinels of -sentinels.
func sentinelPools() (*sentinel.Pool, *sentinel.Pool) {
	addrs := strings.Split(*sentinels, ",")
	mk := func(extra ...sentinel.Option) *sentinel.Pool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		o := append([]sentinel.Option{sentinel.WithDialOptions(append(dialOptions(), redis.DialReadTimeout(*rto))...)}, extra...)
		p, err := sentinel.New(ctx, addrs, *master, o...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker: sentinel:", err)
			os.Exit(2)
		}
		return p
	}
	var lib *sentinel.Pool
	if *waitN > 0 {
		lib = mk(sentinel.WithWait(*waitN, *waitTO))
	} else {
		lib = mk()
	}
	return lib, mk()
}

// emit records an event of the process as a whole (goroutine 0).
func emit(e history.Event) { main0.emit(e) }

// emit records an event of this actor.
func (a *actor) emit(e history.Event) {
	e.W, e.Pid, e.G, e.Name = *id, pid, a.g, a.name
	e.Mono = time.Since(mono).Microseconds()
	if err := hw.Write(e); err != nil {
		fmt.Fprintln(os.Stderr, "worker: history:", err)
		os.Exit(4)
	}
}

func (a *actor) dialBook() error {
	var c redis.Conn
	var err error
	if bookPool != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err = bookPool.GetContext(ctx)
		cancel()
	} else {
		c, err = redis.Dial("tcp", *addr, dialOptions()...)
	}
	if err != nil {
		return err
	}
	if *histName {
		if _, err := c.Do("CLIENT", "SETNAME", "hist"); err != nil {
			c.Close()
			return err
		}
	}
	a.book = c
	return nil
}

// bookDo runs a bookkeeping command, redialling for up to 15s: the tests kill
// connections and restart the server under it.
func (a *actor) bookDo(cmd string, args ...interface{}) (interface{}, error) {
	var err error
	for i := 0; i < 150; i++ {
		if a.book == nil {
			if err = a.dialBook(); err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
		}
		var v interface{}
		v, err = a.book.Do(cmd, args...)
		if err == nil {
			return v, nil
		}
		var re redis.Error
		if errors.As(err, &re) && !strings.HasPrefix(string(re), "LOADING") {
			return nil, err
		}
		a.book.Close()
		a.book = nil
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

func (a *actor) serverTime() int64 {
	v, err := redis.Int64s(a.bookDo("TIME"))
	if err != nil || len(v) != 2 {
		fmt.Fprintln(os.Stderr, "worker: TIME:", err)
		os.Exit(4)
	}
	return v[0]*1_000_000 + v[1]
}

// leaseScript reads, in one step, Redis TIME and the lease deadline and
// record Redis keeps for each token in ARGV.
var leaseScript = redis.NewScript(2, `
local t = redis.call('TIME')
local out = {t[1], t[2]}
for _, tok in ipairs(ARGV) do
  out[#out + 1] = redis.call('ZSCORE', KEYS[1], tok) or ''
  out[#out + 1] = redis.call('HGET', KEYS[2], 't:' .. tok) or ''
end
return out`)

// rwLeaseScript reads, in one step, Redis TIME and the deadline of the
// RWMutex lease with the fence in ARGV[1] (its leases are keyed by
// acquisition id; the holder record "h:"..acqID starts "mode|fence|").
var rwLeaseScript = redis.NewScript(2, `
local t = redis.call('TIME')
local out = {t[1], t[2], ''}
local l = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #l, 2 do
  local rec = redis.call('HGET', KEYS[2], 'h:' .. l[i]) or ''
  if string.match(rec, '^[rw]|(%d+)|') == ARGV[1] then out[3] = l[i + 1] end
end
return out`)

// leaseInfo returns Redis TIME (µs) and the deadline (ms) of the lease with
// this fence on toks (the earliest of their deadlines: the tokens of one
// lease share one), or 0 when Redis records no such lease on one of them.
func (a *actor) leaseInfo(toks []string, fence int64) (int64, int64) {
	keys := keys
	if a.keys != nil {
		keys = *a.keys
	}
	args := []interface{}{keys.Leases, keys.Holders}
	for _, t := range toks {
		args = append(args, t)
	}
	script := leaseScript
	if rwm != nil {
		script, toks = rwLeaseScript, []string{""}
		args = []interface{}{keys.Leases, keys.Holders, fence}
	}
	for i := 0; ; i++ {
		v, err := redis.Strings(script.Do(a.bookConn(), args...))
		if err != nil || len(v) != 2+2*len(toks) && rwm == nil || len(v) != 3 && rwm != nil {
			if i < 150 {
				a.book.Close()
				a.book = nil
				time.Sleep(100 * time.Millisecond)
				continue
			}
			fmt.Fprintln(os.Stderr, "worker: lease info:", err)
			os.Exit(4)
		}
		s, _ := strconv.ParseInt(v[0], 10, 64)
		us, _ := strconv.ParseInt(v[1], 10, 64)
		now := s*1_000_000 + us
		var dl int64
		for j := range toks {
			score := v[2+2*j]
			if rwm == nil {
				parts := strings.Split(v[3+2*j], "|")
				if len(parts) < 2 || parts[1] != strconv.FormatInt(fence, 10) {
					return now, 0
				}
			}
			if score == "" {
				return now, 0
			}
			d, _ := strconv.ParseFloat(score, 64)
			if j == 0 || int64(d) < dl {
				dl = int64(d)
			}
		}
		return now, dl
	}
}

func (a *actor) bookConn() redis.Conn {
	for i := 0; a.book == nil && i < 150; i++ {
		if err := a.dialBook(); err != nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if a.book == nil {
		fmt.Fprintln(os.Stderr, "worker: no bookkeeping connection")
		os.Exit(4)
	}
	return a.book
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
func (a *actor) acquire(sem *redsem.Semaphore, k int) (*redsem.Lease, int64, bool) {
	t0 := a.serverTime()
	a.emit(history.Event{K: history.KWait, T0: t0, N: k})
	ctx, cancel := context.WithTimeout(context.Background(), *acqTO)
	defer cancel()
	intended := false
	if *storm && a.g >= *steady && rand.IntN(4) != 0 {
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
	var ended atomic.Int64 // when ctx ended (UnixNano)
	stop := context.AfterFunc(ctx, func() { ended.Store(time.Now().UnixNano()) })
	defer stop()
	var l *redsem.Lease
	var err error
	switch {
	case rwm != nil && k == 1 && *mode != "mut-rwread":
		l, err = rwm.Lock(ctx)
	case rwm != nil:
		l, err = rwm.RLock(ctx)
	case weights != nil:
		l, err = sem.AcquireN(ctx, k)
	default:
		l, err = sem.Acquire(ctx)
	}
	if err != nil {
		cl := classify(err)
		switch {
		case cl == "ctx" && intended:
			var lag int64
			if e := ended.Load(); e > 0 {
				lag = max(time.Now().UnixNano()-e, 0) / 1000
			}
			a.emit(history.Event{K: history.KCancel, N: k, Err: err.Error(), Lag: lag})
		case cl == "ctx":
			a.emit(history.Event{K: history.KStarved, N: k, Err: err.Error()})
		case *exitOnErr || cl == "wrongtype" || cl == "size" || cl == "corrupt" || cl == "noperm":
			a.emit(history.Event{K: history.KFatal, Class: cl, Err: err.Error()})
			os.Exit(3)
		default:
			a.emit(history.Event{K: history.KAcqErr, N: k, Class: cl, Err: err.Error()})
			time.Sleep(20 * time.Millisecond)
		}
		return nil, t0, false
	}
	return l, t0, true
}

// runActors runs -goroutines actors on the one semaphore, and returns once
// every one has finished.
func runActors(sem *redsem.Semaphore) int {
	if *nGor == 1 {
		return main0.loop(sem)
	}
	var wg sync.WaitGroup
	codes := make([]int, *nGor)
	for g := 0; g < *nGor; g++ {
		a := main0
		if g > 0 {
			a = &actor{g: g}
			if err := a.dialBook(); err != nil {
				fmt.Fprintln(os.Stderr, "worker: bookkeeping connection:", err)
				return 4
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[a.g] = a.loop(sem)
		}()
	}
	wg.Wait()
	for _, c := range codes {
		if c != 0 {
			return c
		}
	}
	return 0
}

// stopped reports whether the -stopfile exists: the test has seen what it
// waited for and ends the run.
func stopped() bool {
	if *stopFile == "" {
		return false
	}
	_, err := os.Stat(*stopFile)
	return err == nil
}

func (a *actor) loop(sem *redsem.Semaphore) int {
	end := time.Now().Add(*dur)
	for i := 0; (*iters == 0 || i < *iters) && time.Now().Before(end) && !stopped(); {
		k := 1
		if weights != nil {
			k = weights[rand.IntN(len(weights))]
		}
		if rwm != nil && rand.Float64() >= *writeP {
			k = 0 // a read
		}
		l, t0, ok := a.acquire(a.pick(sem), k)
		if !ok {
			continue
		}
		i++
		a.seq++
		s := a.seq
		toks := l.Tokens()
		tok := l.Token()
		if rwm != nil && k == 1 {
			// A write, whichever side the broken mode took.
			epoch, _, _ := strings.Cut(tok, ":")
			tok = epoch + ":w"
		}
		if len(toks) != max(k, 1) {
			a.emit(history.Event{K: history.KFatal, Class: "count", Err: fmt.Sprintf("AcquireN(%d) returned a lease on %d tokens %v", k, len(toks), toks)})
		}
		now, dl := a.leaseInfo(toks, l.Fence())
		valid := l.Valid()
		a.emit(history.Event{K: history.KAcq, S: s, N: k, Tok: tok, Toks: multi(toks), Fence: l.Fence(), T0: t0, T: now, DL: dl, Valid: valid})
		if valid {
			hold := randDur(*holdMin, *holdMax)
			switch {
			case *mode == "mut-norelcheck" && rand.Float64() < *staleP:
				// The broken holder does not watch its lease either.
				time.Sleep(2**ttl + *ttl/2)
			case *mode == "mut-wleak" && len(toks) > 1:
				// The broken weighted holder frees one of its k tokens early
				// (its lease and record gone, the token pushed back: a raw
				// LPUSH alone would not do, the library drops a popped token
				// that is still leased) and goes on as if it held all k.
				early := time.Duration(float64(hold) * *leakAfter)
				a.hold1(l, early)
				_ = a.uncheckedRelease(toks[len(toks)-1])
				a.hold1(l, hold-early)
			default:
				a.hold1(l, hold)
			}
		}
		tr := a.serverTime()
		v := l.Valid()
		a.emit(history.Event{K: history.KRelStart, S: s, Tok: l.Token(), Fence: l.Fence(), T: tr, Valid: v, Done: isDone(l)})
		var err error
		if *mode == "mut-norelcheck" {
			err = a.uncheckedRelease(l.Token())
		} else {
			err = release(l)
		}
		a.emit(history.Event{K: history.KRel, S: s, Tok: l.Token(), Fence: l.Fence(), Class: classify(err), Err: errString(err)})
		time.Sleep(randDur(0, *gapMax))
	}
	a.emit(history.Event{K: history.KExit})
	return 0
}

// multi returns toks when a lease holds several, and nil for one (whose
// token is the event's Tok).
func multi(toks []string) []string {
	if len(toks) > 1 {
		return toks
	}
	return nil
}

// hold keeps the lease for d, or until it ends. A holder that was frozen
// (SIGSTOP) past its deadline reports what it finds when it resumes.
func (a *actor) hold1(l *redsem.Lease, d time.Duration) {
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
		a.emit(history.Event{K: history.KRevived, Tok: l.Token(), Fence: l.Fence(), T: a.serverTime(),
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

func (a *actor) uncheckedRelease(tok string) error {
	_, err := uncheckedScript.Do(a.bookConn(), keys.Tokens, keys.Leases, keys.Holders, tok)
	return err
}

// rawPopLoop is the broken client of mode mut-rawpop: it takes tokens with
// BLPOP and records no lease, then pushes them back.
func (a *actor) rawPopLoop() int {
	c, err := redis.Dial("tcp", *addr, dialOptions()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 4
	}
	defer c.Close()
	end := time.Now().Add(*dur)
	for time.Now().Before(end) {
		t0 := a.serverTime()
		a.emit(history.Event{K: history.KWait, T0: t0})
		v, err := redis.Strings(c.Do("BLPOP", keys.Tokens, "0.5"))
		if err != nil || len(v) != 2 {
			continue
		}
		a.seq++
		tok := v[1]
		a.emit(history.Event{K: history.KAcq, S: a.seq, Tok: tok, T0: t0, T: a.serverTime(), Valid: true})
		time.Sleep(randDur(*holdMin, *holdMax))
		a.emit(history.Event{K: history.KRelStart, S: a.seq, Tok: tok, T: a.serverTime(), Valid: true})
		_, err = c.Do("LPUSH", keys.Tokens, tok)
		a.emit(history.Event{K: history.KRel, S: a.seq, Tok: tok, Class: classify(err)})
		time.Sleep(randDur(0, *gapMax))
	}
	a.emit(history.Event{K: history.KExit})
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

func (a *actor) rogueReclaimer() int {
	end := time.Now().Add(*dur)
	for time.Now().Before(end) {
		_, _ = reclaimAllScript.Do(a.bookConn(), keys.Tokens, keys.Leases, keys.Holders)
		time.Sleep(randDur(*holdMin, *holdMax))
	}
	a.emit(history.Event{K: history.KExit})
	return 0
}

// oneshot acquires once and releases, recording the outcome: for bad-input
// tests.
func (a *actor) oneshot(sem *redsem.Semaphore) int {
	ctx, cancel := context.WithTimeout(context.Background(), *acqTO)
	defer cancel()
	l, err := sem.Acquire(ctx)
	if err != nil {
		a.emit(history.Event{K: history.KFatal, Class: classify(err), Err: err.Error()})
		return 3
	}
	a.seq++
	now, dl := a.leaseInfo([]string{l.Token()}, l.Fence())
	a.emit(history.Event{K: history.KAcq, S: a.seq, Tok: l.Token(), Fence: l.Fence(), T: now, DL: dl, Valid: l.Valid()})
	time.Sleep(*holdMin)
	a.emit(history.Event{K: history.KRelStart, S: a.seq, Tok: l.Token(), Fence: l.Fence(), T: a.serverTime(), Valid: l.Valid()})
	err = release(l)
	a.emit(history.Event{K: history.KRel, S: a.seq, Tok: l.Token(), Fence: l.Fence(), Class: classify(err), Err: errString(err)})
	if err != nil {
		return 3
	}
	a.emit(history.Event{K: history.KExit})
	return 0
}
