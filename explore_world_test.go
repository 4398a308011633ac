package redsem

// The explorer's runs: virtual clients executing programs of public
// operations in the world of explore_sim_test.go, the steps a scheduler may
// choose, and the invariants checked after every step
// (explore_check_test.go).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/failpoint"
	"github.com/redsem/redsem/rate"
)

// opKind is a public operation a virtual client performs.
type opKind int

const (
	opAcquire     opKind = iota // Acquire, cancellable
	opTryAcquire                // TryAcquire
	opAcquireN                  // AcquireN(n), cancellable
	opTryAcquireN               // TryAcquireN(n), cancellable
	opRelease                   // Release of the lease held
	opRefresh                   // Refresh(ttl) of the lease held
	opRefresh2                  // two Refreshes of the lease held at once: ttl and ttl2
	opResize                    // Resize(n)
	opReclaim                   // Reclaim
	opRepair                    // Repair
	opCrash                     // the process dies here: it never acts again
	opPause                     // wait until the scheduler lets this client go on
	opRLock                     // RWMutex.RLock, cancellable
	opLock                      // RWMutex.Lock, cancellable
	opTryRLock                  // RWMutex.TryRLock
	opTryLock                   // RWMutex.TryLock
	opHold                      // work for ttl (virtual time), holding what it holds
)

// op is one step of a client's program.
type op struct {
	kind     opKind
	n        int
	ttl      time.Duration
	ttl2     time.Duration
	units    []int // a rate gate's start: units per limit; SetRate: n per limit
	cancelOK bool  // the scheduler may end this operation's context
}

func (o op) String() string {
	switch o.kind {
	case opAcquire:
		return "Acquire"
	case opTryAcquire:
		return "TryAcquire"
	case opAcquireN:
		return fmt.Sprintf("AcquireN(%d)", o.n)
	case opTryAcquireN:
		return fmt.Sprintf("TryAcquireN(%d)", o.n)
	case opRelease:
		return "Release"
	case opRefresh:
		return fmt.Sprintf("Refresh(%v)", o.ttl)
	case opRefresh2:
		return fmt.Sprintf("Refresh(%v) || Refresh(%v)", o.ttl, o.ttl2)
	case opResize:
		return fmt.Sprintf("Resize(%d)", o.n)
	case opReclaim:
		return "Reclaim"
	case opRepair:
		return "Repair"
	case opCrash:
		return "crash"
	case opPause:
		return "pause"
	case opRLock:
		return "RLock"
	case opLock:
		return "Lock"
	case opTryRLock:
		return "TryRLock"
	case opTryLock:
		return "TryLock"
	case opHold:
		return fmt.Sprintf("hold %v", o.ttl)
	}
	if s := electionOpString(o); s != "" {
		return s
	}
	return rateOpString(o)
}

// stranger is a write by someone who is not a redsem client: a key
// overwritten with another type (and later put back as it was), or a
// corrupted field.
type stranger struct {
	label string
	key   func(k keys) string // the key to overwrite with a string
	pend  bool                // or: the pending list of the oldest registered waiter
	hset  [2]string           // or: a meta field and the value to write
	forge string              // or: push onto the token list a "copy" of a valid token, an "old"-epoch one, or "garbage"
}

// scenario is what one run starts from.
type scenario struct {
	name  string
	size  int
	ttl   time.Duration
	grace time.Duration
	setup []int  // clients that Acquire, in order, before the run
	progs [][]op // each client's program
	// shares maps a client to the client whose lease its Release and
	// Refresh act on: a second goroutine of the same process (a user's
	// Refresh beside auto-refresh's).
	shares map[int]int
	// Which steps the scheduler may choose besides exec and time: faults
	// (drop, cancel, kill) at most maxFaults times, data loss, strangers
	// (applied in order, each once, and always undone by the end).
	lazyDeliver bool // deliveries are choices (else made at once)
	drops       bool
	kills       bool
	restart     bool
	clock       bool // the server's clock may stand still or step back (clockFaults)
	maxFaults   int
	strangers   []stranger
	// rw runs the clients on an RWMutex of the name instead (RLock, Lock,
	// their tries, Release, Refresh, crash); setup is then empty, and the
	// checks are explore_rw_test.go's.
	rw bool
	// idle is the clients' WithIdleExpiry (0: off). The keys' expiry is
	// then one of the timed events time passes to.
	idle time.Duration
	// defaults builds the clients with the options a user gets by default
	// (shared waiting, auto-refresh, DefaultTTL and DefaultGrace; ttl and
	// grace should say so), labelled and adopting the size.
	defaults bool
	// process maps a client to an earlier client whose process it is a
	// goroutine of: it shares that one's Semaphore (or RWMutex) and
	// connections, and dies with it.
	process map[int]int
	// rate, when set, gives every client a rate gate (a quota with more
	// limits than one) of the name with these limits, for the programs and
	// checks of explore_rate_test.go; setup is then empty.
	rate []rate.Limit
	// election, when set, gives every process an Election of the name (with
	// DefaultTTL unless ttl says otherwise) for the programs and checks of
	// explore_election_test.go; setup is then empty, and r.k are the keys
	// of the election's mutex.
	election bool
}

// vclient is a virtual client: a goroutine running a program, on a
// Semaphore of its own unless it shares its process with others
// (scenario.process).
type vclient struct {
	run      *run
	id       int
	proc     int // the first client of its process
	sem      *Semaphore
	rw       *RWMutex // with scenario.rw
	prog     []op
	pc       int
	busy     int // goroutines running its current operation
	cur      op
	lease    *Lease
	leaseOp  op   // the operation that granted lease: the permits it asked for
	preLoss  bool // lease granted before the server lost its data
	cancel   context.CancelFunc
	canceled bool
	dead     bool
	results  []string
	// Facts collected while its current operation ran.
	selfReleased bool
	trySnap      *trySnapshot
	newBelief    bool
}

// exploreSwitches are failpoints that answer true in explored runs: the
// test-only switches that bring an old bug back (failpoint.go).
var exploreSwitches = map[string]bool{}

// step is one choice of the scheduler.
type step struct {
	label string
	apply func(r *run)
	fault bool
}

// run is one execution of a scenario under a chooser.
type run struct {
	sc          scenario
	w           *simWorld
	m           *miniredis.Miniredis
	k           keys
	clients     []*vclient
	faults      int
	strangerI   int // strangers applied so far
	saved       map[string]string
	savedTTL    map[string]bool // a saved key had an (idle) expiry
	loss        bool            // the server lost its data during the run
	lostAcqs    map[string]bool // the acquisitions Redis recorded when it lost its data
	draining    bool            // no more faults; replies are read at once
	corrupted   bool            // a stranger wrote a corrupt meta field
	pendKey     string          // the pending list a stranger overwrote
	forged      map[string]int  // copies of valid tokens a stranger pushed
	repairAtEnd bool            // a stranger pushed tokens: Repair before the final Check
	chk         checker
	rate        *rateRun     // with scenario.rate
	el          *electionRun // with scenario.election
	trace       []string
	// by is the client whose operation took a connection; a connection a
	// goroutine of the library took (a pump, auto-refresh, a background
	// settle) is its process's, whose bg client runs no operation.
	by map[*simConn]*vclient
	bg map[int]*vclient
	// granted: the acquisitions whose lease reached a client; cancels:
	// the faults that were a context's end; killed: a process died.
	granted map[string]bool
	cancels int
	killed  bool
	// broke: clients of a process whose connection a fault broke during
	// their current operation (its driver may back off before it retries).
	broke map[int]bool
}

const exploreName = "ex"

// newRun builds the world for sc on m (flushed) and runs the setup. Every
// walk starts with each script loaded, as a service long at work finds
// them, never with what the walk before left: so a walk replays alone as
// it ran among others.
func newRun(env *exploreEnv, sc scenario) (*run, error) {
	m, exec := env.m, env.exec
	m.FlushAll()
	if err := loadScripts(exec); err != nil {
		return nil, err
	}
	nclients := len(sc.progs)
	w := newSimWorld(m, exec, nclients, scriptNames())
	r := &run{sc: sc, w: w, m: m, saved: map[string]string{}, savedTTL: map[string]bool{}, forged: map[string]int{},
		by: map[*simConn]*vclient{}, bg: map[int]*vclient{}, granted: map[string]bool{}, broke: map[int]bool{}}
	engine.Clk = w
	failpoint.Set(func(p string) bool {
		// With the defaults, a grant read and not yet taken is a point
		// too: there a waiter of shared waiting may leave before its pump
		// hands the grant over.
		if pointsScheduled[p] || sc.defaults && p == "acquire.granted" {
			w.atPoint(p)
		}
		return exploreSwitches[p]
	})
	for i := 0; i < nclients; i++ {
		cl := &vclient{run: r, id: i, proc: i, prog: sc.progs[i]}
		if p, ok := sc.process[i]; ok {
			root := r.clients[p]
			cl.proc, cl.sem, cl.rw = root.proc, root.sem, root.rw
			r.clients = append(r.clients, cl)
			continue
		}
		pool, label := procPool{r, w.pools[i]}, WithLabel(fmt.Sprintf("c%d", i))
		opts := []Option{label, WithAdoptSize()}
		rwOpts := []Option{label}
		if !sc.defaults {
			opts = append(opts, WithTTL(sc.ttl), WithGrace(sc.grace), WithFixedTTL(), WithWaitConnections(0), WithIdleExpiry(sc.idle))
			rwOpts = append(rwOpts, WithTTL(sc.ttl), WithGrace(sc.grace), WithFixedTTL())
		}
		sem, err := NewSemaphore(pool, exploreName, sc.size, opts...)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			r.k = sem.k
		}
		cl.sem = sem
		if sc.rw {
			if cl.rw, err = NewRWMutex(pool, exploreName, rwOpts...); err != nil {
				return nil, err
			}
			if i == 0 {
				r.k = cl.rw.s.k
			}
		}
		r.clients = append(r.clients, cl)
	}
	if sc.rw {
		rwAdmin, err := NewRWMutex(env.direct, exploreName, WithTTL(sc.ttl), WithFixedTTL())
		if err != nil {
			return nil, err
		}
		r.chk.rwAdmin = rwAdmin
	}
	if sc.rate != nil {
		if err := r.newRate(env); err != nil {
			return nil, err
		}
	}
	if sc.election {
		if err := r.newElection(env); err != nil {
			return nil, err
		}
	}
	admin, err := NewSemaphore(env.direct, exploreName, 1, WithAdoptSize(), WithIdleExpiry(sc.idle))
	if err != nil {
		return nil, err
	}
	r.chk.init(admin)
	r.trace = append(r.trace, fmt.Sprintf("setup: size %d, ttl %v, c%v acquire", sc.size, sc.ttl, sc.setup))
	// Setup: each listed client acquires, alone, every step taken at once.
	r.draining = true
	defer func() { r.draining = false }()
	for _, id := range sc.setup {
		cl := r.clients[id]
		r.startOp(cl, op{kind: opAcquire})
		for cl.busy > 0 {
			if err := r.quiesceDelivering(); err != nil {
				return nil, err
			}
			w.mu.Lock()
			busy := cl.busy
			w.mu.Unlock()
			if busy == 0 {
				break
			}
			st := r.enabled(false)
			if len(st) == 0 {
				return nil, fmt.Errorf("setup of c%d stuck", id)
			}
			st[0].apply(r)
		}
		if cl.lease == nil {
			return nil, fmt.Errorf("setup: c%d got no lease: %v", id, cl.results)
		}
		cl.results = nil
	}
	w.log = nil
	return r, nil
}

// opKey marks an operation's context with its client (procPool).
type opKey struct{}

// procPool is a process's pool: the world's pool of its first client, that
// notes which client's operation took each connection.
type procPool struct {
	r *run
	p *simPool
}

func (p procPool) GetContext(ctx context.Context) (redis.Conn, error) {
	c, err := p.p.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	w := p.r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if cl, ok := ctx.Value(opKey{}).(*vclient); ok {
		p.r.by[c.(*simConn)] = cl
	} else {
		delete(p.r.by, c.(*simConn))
	}
	return c, nil
}

// byLocked is the client whose operation wrote c's commands: its process's
// bg client (running no operation) for a goroutine of the library (w.mu
// held).
func (r *run) byLocked(c *simConn) *vclient {
	if cl := r.by[c]; cl != nil {
		return cl
	}
	if r.bg[c.client] == nil {
		r.bg[c.client] = &vclient{run: r, id: c.client, proc: c.client}
	}
	return r.bg[c.client]
}

// startOp runs o for cl in a goroutine of the world.
func (r *run) startOp(cl *vclient, o op) {
	w := r.w
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), opKey{}, cl))
	w.mu.Lock()
	cl.cur, cl.cancel, cl.canceled = o, cancel, false
	delete(r.broke, cl.id)
	cl.selfReleased, cl.trySnap = false, nil
	w.mu.Unlock()
	done := func(res string, l *Lease, keep bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		cl.busy--
		if l != nil {
			r.granted[l.acqID] = true
		}
		if keep {
			cl.lease, cl.preLoss, cl.newBelief = l, l != nil && r.lostAcqs[l.acqID], l != nil
			if l != nil {
				cl.leaseOp = o
			}
		}
		cl.results = append(cl.results, res)
		r.trace = append(r.trace, fmt.Sprintf("  c%d %v -> %s", cl.id, o, res))
		if cl.busy == 0 {
			cancel()
		}
	}
	lease := cl.lease
	if owner, ok := r.sc.shares[cl.id]; ok {
		lease = r.clients[owner].lease
	}
	run1 := func(f func() (string, *Lease, bool)) {
		w.mu.Lock()
		cl.busy++
		w.mu.Unlock()
		w.Go(func() {
			res, l, keep := f()
			done(res, l, keep)
		})
	}
	switch o.kind {
	case opAcquire, opTryAcquire, opAcquireN, opTryAcquireN:
		run1(func() (string, *Lease, bool) {
			var l *Lease
			var err error
			switch o.kind {
			case opAcquire:
				l, err = cl.sem.Acquire(ctx)
			case opTryAcquire:
				l, err = cl.sem.TryAcquire(ctx)
				if errors.Is(err, ErrNoToken) {
					r.chk.tryRefused(cl)
				}
			case opTryAcquireN:
				// Refused while a weighted request collects or waits, or
				// half way: no checker rule, beyond the invariants.
				l, err = cl.sem.TryAcquireN(ctx, o.n)
			default:
				l, err = cl.sem.AcquireN(ctx, o.n)
			}
			if err != nil {
				return "err " + shortErr(err), nil, false
			}
			return fmt.Sprintf("granted %s fence %d", strings.Join(l.Tokens(), ","), l.Fence()), l, true
		})
	case opRLock, opLock, opTryRLock, opTryLock:
		run1(func() (string, *Lease, bool) {
			var l *Lease
			var err error
			switch o.kind {
			case opRLock:
				l, err = cl.rw.RLock(ctx)
			case opLock:
				l, err = cl.rw.Lock(ctx)
			case opTryRLock:
				l, err = cl.rw.TryRLock(ctx)
			default:
				l, err = cl.rw.TryLock(ctx)
			}
			if errors.Is(err, ErrNoToken) {
				r.chk.tryRefused(cl)
			}
			if err != nil {
				return "err " + shortErr(err), nil, false
			}
			return fmt.Sprintf("granted %s fence %d", l.Token(), l.Fence()), l, true
		})
	case opRelease:
		run1(func() (string, *Lease, bool) {
			if lease == nil {
				return "nothing held", nil, false
			}
			err := lease.Release(ctx)
			if err == nil {
				r.chk.releasedOK(cl)
			}
			return errString(err), nil, true
		})
	case opRefresh, opRefresh2:
		ttls := []time.Duration{o.ttl}
		if o.kind == opRefresh2 {
			ttls = append(ttls, o.ttl2)
		}
		for _, ttl := range ttls {
			ttl := ttl
			run1(func() (string, *Lease, bool) {
				if lease == nil {
					return "nothing held", nil, false
				}
				return fmt.Sprintf("(%v) %s", ttl, errString(lease.Refresh(ctx, ttl))), nil, false
			})
		}
	case opResize:
		run1(func() (string, *Lease, bool) { return errString(cl.sem.Resize(ctx, o.n)), nil, false })
	case opReclaim:
		run1(func() (string, *Lease, bool) {
			n, err := cl.sem.Reclaim(ctx)
			if err != nil {
				return "err " + shortErr(err), nil, false
			}
			return fmt.Sprintf("reclaimed %d", n), nil, false
		})
	case opRepair:
		run1(func() (string, *Lease, bool) {
			rep, err := cl.sem.Repair(ctx)
			if err != nil {
				return "err " + shortErr(err), nil, false
			}
			return fmt.Sprintf("minted %v dropped %v", rep.Minted, rep.Dropped), nil, false
		})
	case opHold:
		run1(func() (string, *Lease, bool) {
			engine.Clk.WaitOrDone(ctx, nil, o.ttl)
			return "went on", nil, false
		})
	case opPause:
		run1(func() (string, *Lease, bool) {
			r.w.atPoint(fmt.Sprintf("c%d pause", cl.id))
			return "went on", nil, false
		})
	case opWait, opAllow, opSetRate:
		run1(func() (string, *Lease, bool) { return r.rateOp(ctx, cl, o), nil, false })
	case opCampaign, opProclaim, opResign, opObserve, opLeader:
		run1(func() (string, *Lease, bool) { return r.electionOp(ctx, cl, o) })
	case opCrash:
		w.mu.Lock()
		r.killLocked(cl)
		r.trace = append(r.trace, fmt.Sprintf("  c%d crashes", cl.id))
		w.mu.Unlock()
	}
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return "err " + shortErr(err)
}

func shortErr(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "redsem: ")
	if len(s) > 90 {
		s = s[:90] + "..."
	}
	return s
}

// startIdle starts the next operation of every idle, living client; with
// goroutines sharing a process, of one client only (settle calls it again
// once the world is quiet), so that they take connections and queue in an
// order that replays.
func (r *run) startIdle() bool {
	started := false
	for _, cl := range r.clients {
		r.w.mu.Lock()
		idle := !cl.dead && cl.busy == 0 && cl.pc < len(cl.prog)
		r.w.mu.Unlock()
		if idle {
			o := cl.prog[cl.pc]
			cl.pc++
			r.startOp(cl, o)
			started = true
			if len(r.sc.process) > 0 {
				return true
			}
		}
	}
	return started
}

// settle starts what can start and waits until the world is quiet. Unless
// the scenario makes deliveries choices, replies that arrived are read
// at once, in connection order, as part of settling.
func (r *run) settle() error {
	for {
		if err := r.w.quiesce(); err != nil {
			return err
		}
		if r.startIdle() {
			continue
		}
		if r.sc.lazyDeliver && !r.draining {
			return nil
		}
		if c := r.firstDelivery(); c != nil {
			r.deliver(c)
			continue
		}
		if r.passFirstPoint() {
			continue
		}
		return nil
	}
}

// passFirstPoint lets the oldest goroutine parked at a failpoint go on. A
// grant read and not yet taken, with the defaults, stays a choice unless
// the run drains (or sets up).
func (r *run) passFirstPoint() bool {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	for _, p := range r.w.points {
		if r.draining || !(r.sc.defaults && p.name == "acquire.granted") {
			r.w.pass(p)
			return true
		}
	}
	return false
}

// quiesceDelivering waits for quiet, reading replies as they come.
func (r *run) quiesceDelivering() error {
	for {
		if err := r.w.quiesce(); err != nil {
			return err
		}
		if c := r.firstDelivery(); c != nil {
			r.deliver(c)
			continue
		}
		if !r.passFirstPoint() {
			return nil
		}
	}
}

// firstDelivery is the first connection with a reply for a parked reader.
func (r *run) firstDelivery() *simConn {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	for _, c := range r.w.sortedConns() {
		if c.recv != nil && len(c.replies) > 0 {
			return c
		}
	}
	return nil
}

// killLocked makes cl's process dead: its connections break, its pool
// refuses, its clients start nothing more, and what they held is forgotten
// by them. Their operations' contexts end, and their waits return: a
// process's goroutines die with it, where here they would go on (a wait
// waits out an unreachable Redis while its context lasts).
func (r *run) killLocked(cl *vclient) {
	r.killed = true
	for _, x := range r.clients {
		if x.proc == cl.proc {
			x.dead = true
			if x.cancel != nil {
				x.cancel()
			}
		}
	}
	r.w.dead[cl.proc] = true
	for _, c := range r.w.conns {
		if c.client == cl.proc {
			c.breakLocked(&simNetError{"killed"})
		}
	}
	r.w.pools[cl.proc].idle = nil
	for _, sw := range r.w.waits {
		if !sw.woken && sw.ctx.Err() != nil {
			sw.woken = true
			r.w.running++
			close(sw.wake)
		}
	}
}

// activeLocked reports whether a client of cl's process runs an operation
// or holds a lease (w.mu held).
func (r *run) activeLocked(cl *vclient) bool {
	for _, x := range r.clients {
		if x.proc == cl.proc && (x.busy > 0 || x.lease != nil) {
			return true
		}
	}
	return false
}

// enabled lists the steps the scheduler may choose now, in a fixed order.
// With faults false, only progress: exec, deliver, time.
func (r *run) enabled(faults bool) []step {
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []step
	conns := w.sortedConns()
	for _, c := range conns {
		if c.broken == nil && len(c.inbox) > 0 && !c.blocked {
			c := c
			out = append(out, step{label: c.name() + " exec", apply: func(r *run) { r.exec(c) }})
		}
	}
	for _, c := range conns {
		if c.recv != nil && len(c.replies) > 0 {
			c := c
			out = append(out, step{label: c.name() + " reply read", apply: func(r *run) { r.deliver(c) }})
		}
	}
	for i, p := range w.points {
		p := p
		out = append(out, step{label: fmt.Sprintf("%s #%d passes", p.name, i+1), apply: func(r *run) {
			r.w.mu.Lock()
			r.w.pass(p)
			r.w.mu.Unlock()
			r.note(p.name + " passed")
		}})
	}
	if t, ok := w.nextEvent(r.serverDeadlines()); ok {
		out = append(out, step{label: fmt.Sprintf("time +%v", t.Sub(w.now)), apply: func(r *run) { r.advance(t) }})
	}
	if !faults {
		return out
	}
	if r.strangerI < len(r.sc.strangers) {
		i := r.strangerI
		out = append(out, step{label: "stranger: " + r.strangerLabel(i), apply: func(r *run) { r.applyStranger(i) }})
	}
	if r.faults >= r.sc.maxFaults {
		return out
	}
	if r.sc.drops {
		for _, c := range conns {
			if c.broken == nil && (len(c.inbox) > 0 || len(c.replies) > 0) {
				c := c
				out = append(out, step{label: c.name() + " connection drops", fault: true, apply: func(r *run) { r.drop(c) }})
			}
		}
	}
	for _, cl := range r.clients {
		cl := cl
		if !cl.dead && cl.busy > 0 && cl.cur.cancelOK && !cl.canceled {
			out = append(out, step{label: fmt.Sprintf("c%d context ends", cl.id), fault: true, apply: func(r *run) { r.cancel(cl) }})
		}
		if r.sc.kills && cl.proc == cl.id && !cl.dead && r.activeLocked(cl) {
			out = append(out, step{label: fmt.Sprintf("c%d killed", cl.id), fault: true, apply: func(r *run) {
				r.w.mu.Lock()
				r.killLocked(cl)
				r.w.mu.Unlock()
			}})
		}
	}
	if r.sc.restart && !r.loss {
		out = append(out, step{label: "server restarts without its data", fault: true, apply: func(r *run) { r.restart() }})
	}
	if r.sc.restart {
		// The script cache is lost while the data stays: a restart that
		// kept its data (connections break), or a SCRIPT FLUSH between the
		// writes of a pipeline (they don't): the next EVALSHA, maybe the
		// script behind a BLMOVE that just moved a token, answers NOSCRIPT.
		out = append(out,
			step{label: "server restarts with its data, scripts lost", fault: true, apply: func(r *run) { r.flushScripts(true) }},
			step{label: "script cache flushed", fault: true, apply: func(r *run) { r.flushScripts(false) }})
	}
	if r.sc.clock {
		out = append(out, r.clockFaults()...)
	}
	return out
}

// serverDeadlines are the lease and waits deadlines in Redis, as times just
// after they pass, and the moment an idle semaphore's keys expire: moments
// at which the server's view changes, on the clients' clock.
func (r *run) serverDeadlines() []time.Time {
	var out []time.Time
	if ttl := r.m.TTL(r.k.meta); ttl > 0 {
		out = append(out, r.w.now.Add(ttl))
	}
	for _, key := range []string{r.k.leases, r.k.waits} {
		if r.m.Type(key) != "zset" {
			continue
		}
		members, _ := r.m.ZMembers(key)
		for _, mem := range members {
			sc, err := r.m.ZScore(key, mem)
			if err == nil {
				out = append(out, time.UnixMilli(int64(sc)+1).UTC().Add(-r.w.skew))
			}
		}
	}
	return append(out, r.rateDeadlines()...)
}

func (r *run) exec(c *simConn) {
	w := r.w
	w.mu.Lock()
	cl := r.byLocked(c)
	cmd, sent := w.cmdLabel(c.inbox[0]), c.inbox[0]
	if cl == r.bg[c.client] {
		exploreSeen.note(cmd)
	}
	before, v0, at := r.chk.beforeExec(cl, cmd, c.inbox[0]), r.view(), w.srvMs()
	rb := r.rateBefore(cl, c.inbox[0])
	label := w.execute(c)
	r.chk.afterExec(cl, before)
	v1 := r.view()
	r.chk.grants(r, label, v0, v1)
	r.chk.revived(r, label, at, v0, v1)
	var reply interface{}
	if n := len(c.replies); n > 0 {
		reply = c.replies[n-1].v
	}
	r.rateAfter(cl, rb, label, reply)
	r.electionAfter(cl, cmd, sent)
	w.mu.Unlock()
	r.note(c.name() + " " + label)
}

func (r *run) deliver(c *simConn) {
	w := r.w
	w.mu.Lock()
	rep := c.replies[0]
	c.replies = c.replies[1:]
	ch := c.recv
	c.recv = nil
	w.running++
	ch <- rep
	w.mu.Unlock()
	r.note(c.name() + " reply read")
}

func (r *run) drop(c *simConn) {
	r.w.mu.Lock()
	r.breakProc(c.client)
	c.breakLocked(&simNetError{"dropped"})
	r.faults++
	r.w.mu.Unlock()
	r.note(c.name() + " connection drops")
}

// cancel ends cl's context; a read parked under it returns at once, and its
// connection closes, as redigo's DoContext does.
func (r *run) cancel(cl *vclient) {
	r.faults++
	r.cancels++
	cl.canceled = true
	cl.cancel()
	w := r.w
	w.mu.Lock()
	for _, c := range w.conns {
		if c.client == cl.proc && c.recv != nil && c.recvCtx.Err() != nil {
			err := c.recvCtx.Err()
			c.closed = true
			c.breakLocked(err)
		}
	}
	// A bounded wait under the ended context returns too.
	for _, sw := range w.waits {
		if !sw.woken && sw.ctx.Err() != nil {
			sw.woken = true
			w.running++
			close(sw.wake)
		}
	}
	w.mu.Unlock()
	r.note(fmt.Sprintf("c%d context ends", cl.id))
}

// breakProc notes that a connection of process proc broke (w.mu held).
func (r *run) breakProc(proc int) {
	for _, cl := range r.clients {
		if cl.proc == proc && cl.busy > 0 {
			r.broke[cl.id] = true
		}
	}
}

// flushScripts empties the server's script cache, and with restart breaks
// every connection as a restart does; the data stays.
func (r *run) flushScripts(restart bool) {
	r.faults++
	w := r.w
	w.mu.Lock()
	if _, err := w.exec.Do("SCRIPT", "FLUSH"); err != nil {
		panic(err)
	}
	if restart {
		for _, c := range w.conns {
			c.breakLocked(&simNetError{"server restarted"})
			r.breakProc(c.client)
		}
	}
	w.mu.Unlock()
	if restart {
		r.note("server restarts with its data, scripts lost")
	} else {
		r.note("script cache flushed")
	}
}

func (r *run) restart() {
	r.faults++
	r.loss = true
	w := r.w
	w.mu.Lock()
	// A grant read before the loss may reach its client after it.
	r.lostAcqs = map[string]bool{}
	for _, a := range r.view().holders {
		r.lostAcqs[a] = true
	}
	for a := range r.rwView().modes {
		r.lostAcqs[a] = true
	}
	r.m.FlushAll()
	r.electionLost()
	for _, c := range w.conns {
		c.breakLocked(&simNetError{"server restarted"})
		r.breakProc(c.client)
	}
	for _, cl := range r.clients {
		if cl.lease != nil {
			cl.preLoss = true
		}
	}
	// A key a stranger overwrote is lost with the rest: putting it back
	// then changes nothing.
	for key := range r.saved {
		r.saved[key] = lostSide
	}
	w.mu.Unlock()
	r.note("server restarts without its data")
}

func (r *run) advance(t time.Time) {
	w := r.w
	w.mu.Lock()
	d := t.Sub(w.now)
	fire := w.advanceTo(t)
	w.mu.Unlock()
	for _, f := range fire {
		f()
	}
	r.note(fmt.Sprintf("time +%v", d))
}

// lostSide marks a key a stranger overwrote that a restart lost since.
const lostSide = "\x00lost"

func (r *run) strangerLabel(i int) string {
	st := r.sc.strangers[i]
	if st.forge != "" {
		return "pushes a forged token (" + st.forge + ")"
	}
	if st.pend {
		if _, ok := r.saved[r.pendKey]; ok && r.pendKey != "" {
			return "puts the pending list back"
		}
		return "overwrites a waiter's pending list with a string"
	}
	if st.key != nil {
		key := st.key(r.k)
		if _, ok := r.saved[key]; ok {
			return "puts " + strings.TrimPrefix(key, r.k.base) + " back"
		}
		return "overwrites " + strings.TrimPrefix(key, r.k.base) + " with a string"
	}
	return st.label
}

// applyStranger runs stranger action i: overwrite a key with a string
// (saving it), put a saved key back, or write a meta field.
func (r *run) applyStranger(i int) {
	label := r.strangerLabel(i)
	st := r.sc.strangers[i]
	r.w.mu.Lock()
	if st.forge != "" {
		r.forge(st.forge)
	} else if st.key != nil || st.pend {
		// The key's value waits under a side name meanwhile (miniredis's
		// DUMP knows strings only).
		var key string
		if st.pend {
			if r.pendKey == "" {
				ws, _ := redis.Strings(r.w.exec.Do("ZRANGE", r.k.waits, 0, -1))
				for _, w := range ws {
					if strings.HasPrefix(w, "w:") {
						r.pendKey = r.k.pend(w[2:])
						break
					}
				}
				if r.pendKey == "" {
					r.pendKey = r.k.pend("nobody-waits")
				}
			}
			key = r.pendKey
		} else {
			key = st.key(r.k)
		}
		if side, ok := r.saved[key]; ok && side == lostSide {
			delete(r.saved, key) // the restart took the stranger's string too
		} else if ok {
			_, _ = r.w.exec.Do("DEL", key)
			if side != "" {
				_, _ = r.w.exec.Do("RENAME", side, key)
				// With idle expiry, the key comes back as it would be had
				// it stayed: with the expiry its semaphore (or rate gate)
				// has now, none if a use removed it meanwhile, or gone if
				// it was to expire and its semaphore did.
				meta := r.k.meta
				if r.rate != nil && strings.HasPrefix(key, r.rate.k.base) {
					meta = r.rate.k.meta
				}
				switch exp := r.m.HGet(meta, "exp"); {
				case exp != "":
					_, _ = r.w.exec.Do("PEXPIREAT", key, exp)
				case r.savedTTL[key] && !r.m.Exists(meta):
					_, _ = r.w.exec.Do("DEL", key)
				default:
					_, _ = r.w.exec.Do("PERSIST", key)
				}
			}
			delete(r.saved, key)
		} else {
			side := r.k.base + "stranger-saved"
			if n, _ := redis.Int(r.w.exec.Do("EXISTS", key)); n == 0 {
				side = ""
			} else {
				r.savedTTL[key] = r.m.TTL(key) > 0
				_, _ = r.w.exec.Do("RENAME", key, side)
				_, _ = r.w.exec.Do("PERSIST", side) // kept aside, not expired
			}
			r.saved[key] = side
			_, _ = r.w.exec.Do("SET", key, "stranger")
		}
	} else {
		_, _ = r.w.exec.Do("HSET", r.k.meta, st.hset[0], st.hset[1])
		r.corrupted = true
	}
	r.w.serveBlocked()
	r.w.mu.Unlock()
	r.strangerI++
	r.note("stranger " + label)
}

// forge pushes onto the token list what a stranger might: a second copy of
// a valid token (the lowest slot), a token of an older epoch, or garbage
// (mu held). Copies are counted, so the inventory check allows them.
func (r *run) forge(kind string) {
	epoch := r.m.HGet(r.k.meta, "gen")
	if epoch == "" {
		// No semaphore yet: a list without meta is corruption the library
		// refuses (ErrCorrupt), not a forged token among real ones.
		return
	}
	tok := "garbage"
	switch kind {
	case "copy":
		tok = epoch + ":1"
		r.forged[tok]++
	case "old":
		tok = "000000000000:1"
	}
	_, _ = r.w.exec.Do("LPUSH", r.k.tokens, tok)
	r.repairAtEnd = true
}

// note records a step in the trace, with what the world logged meanwhile.
// The trace is written under the world's lock: a client goroutine that
// deliver has just woken appends its result concurrently (the race
// detector caught it when a loaded machine let the goroutine run first).
func (r *run) note(s string) {
	r.w.mu.Lock()
	r.trace = append(r.trace, s)
	r.trace = append(r.trace, r.w.log...)
	r.w.log = nil
	r.w.mu.Unlock()
}

// exploreEnv is the server runs share: miniredis (flushed before each
// run), the connection that executes the scheduled commands, and a pool
// that bypasses the scheduler for the final checks.
type exploreEnv struct {
	m      *miniredis.Miniredis
	exec   redis.Conn
	direct *redis.Pool
}

// chooser picks one of n enabled steps.
type chooser interface {
	choose(r *run, steps []step) int
}

// exploreOnce runs sc under ch for at most depth choices, then drains it
// without faults, checking the invariants after every step. It returns the
// violation found ("" if none) and the trace.
func exploreOnce(env *exploreEnv, sc scenario, ch chooser, depth int) (string, []string, error) {
	r, err := newRun(env, sc)
	if err != nil {
		return "", nil, err
	}
	defer r.teardown()
	if err := r.settle(); err != nil {
		return "", r.trace, err
	}
	if v := r.check(); v != "" {
		return v, r.trace, nil
	}
	for i := 0; i < depth; i++ {
		steps := r.enabled(true)
		if len(steps) == 0 {
			break
		}
		st := steps[ch.choose(r, steps)]
		st.apply(r)
		if err := r.settle(); err != nil {
			return "", r.trace, err
		}
		if v := r.check(); v != "" {
			return v, r.trace, nil
		}
	}
	// Drain: undo the strangers, then progress only, until nothing is left.
	r.draining = true
	for r.strangerI < len(sc.strangers) {
		r.applyStranger(r.strangerI)
		if err := r.settle(); err != nil {
			return "", r.trace, err
		}
	}
	limit := r.w.Now().Add(10 * time.Minute)
	for i := 0; i < 3000; i++ {
		steps := r.enabled(false)
		if len(steps) == 0 || r.w.Now().After(limit) {
			break
		}
		r.drainStep(steps).apply(r)
		if err := r.settle(); err != nil {
			return "", r.trace, err
		}
		if v := r.check(); v != "" {
			return v, r.trace, nil
		}
	}
	if v := r.leaked(); v != "" {
		return v, r.trace, nil
	}
	// The final checks act from outside the world: no scheduling point
	// stops them.
	failpoint.Set(func(p string) bool { return exploreSwitches[p] })
	return r.chk.final(r), r.trace, nil
}

// drainStep is the step the drain takes: the command that reached the
// server first, as Redis serves them (a connection never starves behind
// a busier one), else the first step.
func (r *run) drainStep(steps []step) step {
	r.w.mu.Lock()
	var first *simConn
	for _, c := range r.w.conns {
		if c.broken == nil && len(c.inbox) > 0 && !c.blocked && (first == nil || c.inbox[0].seq < first.inbox[0].seq) {
			first = c
		}
	}
	r.w.mu.Unlock()
	for _, st := range steps {
		if first != nil && st.label == first.name()+" exec" {
			return st
		}
	}
	return steps[0]
}

// teardown ends every client's operation, kills every process, and wakes
// every parked goroutine, letting time run out for every lease (auto-refresh
// and pumps loop until theirs end), until none is left, so that no goroutine
// outlives the run.
func (r *run) teardown() {
	w := r.w
	w.mu.Lock()
	for _, cl := range r.clients {
		if cl.cancel != nil {
			cl.cancel()
		}
		r.killLocked(cl)
	}
	w.mu.Unlock()
	for i := 0; i < 100; i++ {
		w.mu.Lock()
		fire := w.advanceTo(w.now.Add(time.Hour))
		for _, sw := range w.waits {
			if !sw.woken {
				sw.woken = true
				w.running++
				close(sw.wake)
			}
		}
		for len(w.points) > 0 {
			w.pass(w.points[0])
		}
		w.mu.Unlock()
		for _, f := range fire {
			f()
		}
		_ = w.quiesce()
		w.mu.Lock()
		left := len(w.waits) + len(w.points)
		w.mu.Unlock()
		if left == 0 {
			break
		}
	}
	failpoint.Set(nil)
	engine.Clk = engine.RealClock{}
}

// explorerScripts are the scripts a walk runs, by file (as the package's
// variables hold them now: a test may have put a broken one in).
func explorerScripts() map[string]*engine.Script {
	return map[string]*engine.Script{
		"acquire.lua": engine.Acquire.Script, "release.lua": engine.Release.Script, "refresh.lua": engine.Refresh.Script,
		"abort.lua": engine.Abort.Script, "reclaim.lua": engine.Reclaim.Script, "register.lua": engine.Register.Script,
		"status.lua": engine.Status.Script, "acquire_n.lua": engine.AcquireN.Script, "abort_n.lua": engine.AbortN.Script,
		"resize.lua": engine.Resize.Script, "repair.lua": engine.Repair.Script, "check.lua": engine.Check.Script,
		"rw_acquire.lua": engine.RWAcquire.Script, "rw_abort.lua": engine.RWAbort.Script, "rw_release.lua": engine.RWRelease.Script,
		"rw_refresh.lua": engine.RWRefresh.Script, "rate_take.lua": engine.RateTake.Script, "rate_abort.lua": engine.RateAbort.Script,
		"rate_set.lua": engine.RateSet.Script, "rate_status.lua": engine.RateStatus.Script,
		"election.lua": engine.Election.Script, "election_observe.lua": engine.ElectionObserve.Script,
	}
}

// loadScripts loads every script the server lacks (a walk before may have
// lost them): one SCRIPT EXISTS when none is missing, since a load costs
// miniredis a compile.
func loadScripts(exec redis.Conn) error {
	var known []*engine.Script
	args := []interface{}{"EXISTS"}
	for _, s := range explorerScripts() {
		if s.Hash() == "" {
			if err := s.Load(exec); err != nil {
				return err
			}
			continue
		}
		known = append(known, s)
		args = append(args, s.Hash())
	}
	if len(known) == 0 {
		return nil
	}
	there, err := redis.Ints(exec.Do("SCRIPT", args...))
	if err != nil {
		return err
	}
	for i, ok := range there {
		if ok == 0 {
			if err := known[i].Load(exec); err != nil {
				return err
			}
		}
	}
	return nil
}

// scriptNames maps every script's SHA1 (and source) to its file, for the
// schedule.
func scriptNames() map[string]string {
	out := map[string]string{}
	for name, s := range explorerScripts() {
		out[s.Hash()] = name
		out[engine.Source(name)] = name
	}
	return out
}
