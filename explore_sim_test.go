package redsem

// The protocol explorer's world: real client code (every public operation
// of this package) talking to miniredis through connections whose every
// step the explorer schedules, on virtual clocks: the clients' (engine.Clk)
// and the server's (miniredis SetTime, so Redis TIME; key expiry and block
// timeouts follow it). The server's runs with the clients' but may stand
// still or step back (a clock fault), so it is never ahead of theirs.
//
// A command a client writes is not executed when it is written: it waits at
// the server until the scheduler picks "exec" for its connection, and its
// reply waits until the scheduler picks "deliver". Between any two steps the
// scheduler may also drop a connection (the request or the reply is lost),
// end a client's context, kill a client (a process dying between two
// instructions: every connection of it breaks and it never acts again),
// lose the server's data, stop or step back the server's clock, let time
// pass to the next timed event, or let a stranger overwrite a key. Blocking
// commands (BLMOVE, BLPOP) are served the way Redis serves them: in arrival
// order, right after the write that made their list non-empty, and time out
// when the server's clock passes their timeout.
//
// Determinism: the scheduler only chooses once every goroutine of the world
// is parked (waiting for a reply, in engine.Clk.WaitOrDone) or finished, so the
// same choices replay the same run.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/redsem/redsem/internal/engine"
)

// simCmd is one command written by a client; seq orders the commands of
// every connection by when they reached the server.
type simCmd struct {
	name string
	args []interface{}
	seq  int
}

// simReply is one reply, or the error a broken connection reports.
type simReply struct {
	v   interface{}
	err error
}

// simConn is a connection of one virtual client. It satisfies redis.Conn,
// redis.ConnWithContext and redis.ConnWithTimeout.
type simConn struct {
	w      *simWorld
	client int
	id     int // per client, in creation order
	out    []simCmd
	inbox  []simCmd // written, at the server, not yet executed
	// blocked: the inbox's head is a blocking command registered at the
	// server; blockUntil is when it times out by the server's clock (zero:
	// never).
	blocked    bool
	blockSeq   int
	blockUntil time.Time
	replies    []simReply // executed, not yet read
	recv       chan simReply
	recvCtx    context.Context
	broken     error
	closed     bool
}

func (c *simConn) name() string { return fmt.Sprintf("c%d.%d", c.client, c.id) }

// errSimBroken is what a dropped or killed connection reports; it is a
// net-like error, not a Redis error reply.
type simNetError struct{ what string }

func (e *simNetError) Error() string   { return "sim: connection " + e.what }
func (e *simNetError) Timeout() bool   { return false }
func (e *simNetError) Temporary() bool { return false }

func (c *simConn) Close() error {
	w := c.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.broken == nil && len(c.inbox) == 0 && len(c.replies) == 0 && len(c.out) == 0 {
		// Back to the pool, as a redigo pool keeps a healthy connection.
		w.pools[c.client].idle = append(w.pools[c.client].idle, c)
		return nil
	}
	// Closed with work outstanding: Redis drops the client, its blocked
	// command and what it had not executed yet.
	c.closed = true
	c.breakLocked(&simNetError{"closed"})
	return nil
}

func (c *simConn) Err() error {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	return c.broken
}

func (c *simConn) Send(cmd string, args ...interface{}) error {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	if c.broken != nil {
		return c.broken
	}
	c.out = append(c.out, simCmd{name: cmd, args: args})
	return nil
}

func (c *simConn) Flush() error {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	if c.broken != nil {
		return c.broken
	}
	for _, cmd := range c.out {
		c.w.seq++
		cmd.seq = c.w.seq
		c.inbox = append(c.inbox, cmd)
	}
	c.out = nil
	return nil
}

func (c *simConn) Receive() (interface{}, error) { return c.ReceiveContext(context.Background()) }

func (c *simConn) ReceiveWithTimeout(_ time.Duration) (interface{}, error) {
	return c.ReceiveContext(context.Background())
}

// ReceiveContext parks until the scheduler delivers the next reply, breaks
// the connection, or ctx is cancelled (the scheduler's cancel, or the
// client's own: simWorld.cancelRead). Real-time deadlines of ctx are not
// modelled.
func (c *simConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	w := c.w
	w.mu.Lock()
	if c.broken != nil {
		w.mu.Unlock()
		return nil, c.broken
	}
	if len(c.inbox) == 0 && len(c.replies) == 0 {
		w.mu.Unlock()
		return nil, errors.New("sim: receive with nothing outstanding")
	}
	ch := make(chan simReply, 1)
	c.recv, c.recvCtx = ch, ctx
	w.park()
	w.mu.Unlock()
	r := <-ch
	return r.v, r.err
}

func (c *simConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), cmd, args...)
}

func (c *simConn) DoWithTimeout(_ time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	return c.DoContext(context.Background(), cmd, args...)
}

func (c *simConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	if cmd != "" {
		if err := c.Send(cmd, args...); err != nil {
			return nil, err
		}
	}
	if err := c.Flush(); err != nil {
		return nil, err
	}
	var v interface{}
	var err error
	for {
		c.w.mu.Lock()
		left := len(c.inbox) + len(c.replies)
		c.w.mu.Unlock()
		if left == 0 {
			return v, err
		}
		v, err = c.ReceiveContext(ctx)
		if err != nil && !engine.IsRedisError(err) {
			return v, err
		}
	}
}

// breakLocked fails the connection: what it had not executed is lost, a
// blocked command leaves the server's queue, a parked reader gets err.
func (c *simConn) breakLocked(err error) {
	if c.broken == nil {
		c.broken = err
	}
	c.inbox, c.replies, c.out, c.blocked = nil, nil, nil, false
	if c.recv != nil {
		ch := c.recv
		c.recv = nil
		c.w.running++
		ch <- simReply{err: err}
	}
}

// simPool is one virtual client's pool: it hands out idle connections
// first (so a connection broken by a restart is found on first use, as
// with a redigo pool) and fails once the client is dead.
type simPool struct {
	w      *simWorld
	client int
	idle   []*simConn
	nextID int
}

func (p *simPool) GetContext(ctx context.Context) (redis.Conn, error) {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead[p.client] {
		return nil, &simNetError{"refused: client is dead"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return c, nil
	}
	p.nextID++
	c := &simConn{w: w, client: p.client, id: p.nextID}
	w.conns = append(w.conns, c)
	return c, nil
}

// simTimer is a lease timer on the virtual clock.
type simTimer struct {
	w   *simWorld
	at  time.Time
	f   func()
	off bool
}

func (t *simTimer) Stop() bool {
	t.w.mu.Lock()
	defer t.w.mu.Unlock()
	was := !t.off
	t.off = true
	return was
}

func (t *simTimer) Reset(d time.Duration) bool {
	t.w.mu.Lock()
	defer t.w.mu.Unlock()
	was := !t.off
	t.off, t.at = false, t.w.now.Add(d)
	return was
}

// simWait is a goroutine parked in engine.Clk.WaitOrDone.
type simWait struct {
	ctx   context.Context
	done  <-chan struct{}
	at    time.Time // zero: engine.Forever, not a timed event
	wake  chan struct{}
	woken bool
}

// simPoint is a goroutine parked at a failpoint the explorer schedules: a
// client-side step between two Redis interactions whose order against
// other clients' steps matters (refresh.replied: a Refresh read its reply
// and has not applied it yet).
type simPoint struct {
	name string
	seq  int
	wake chan struct{}
}

// pointsScheduled are the failpoints that are scheduling points.
var pointsScheduled = map[string]bool{"refresh.replied": true}

// atPoint parks the calling goroutine at failpoint name until the scheduler
// lets it pass.
func (w *simWorld) atPoint(name string) {
	w.mu.Lock()
	w.seq++
	p := &simPoint{name: name, seq: w.seq, wake: make(chan struct{})}
	w.points = append(w.points, p)
	w.park()
	w.mu.Unlock()
	<-p.wake
}

// pass lets the parked point p go on (mu held).
func (w *simWorld) pass(p *simPoint) {
	for i, x := range w.points {
		if x == p {
			w.points = append(w.points[:i], w.points[i+1:]...)
			break
		}
	}
	w.running++
	close(p.wake)
}

// simWorld is one run: the server, the clients' connections, the clock.
type simWorld struct {
	mu      sync.Mutex
	cond    *sync.Cond
	m       *miniredis.Miniredis
	exec    redis.Conn // executes the scheduled commands on miniredis
	now     time.Time  // the clients' clock
	running int        // goroutines of the world not parked
	conns   []*simConn
	pools   []*simPool
	timers  []*simTimer
	waits   []*simWait
	points  []*simPoint
	dead    map[int]bool
	seq     int // orders commands, blocked commands and points
	names   map[string]string
	log     []string
	// skew is the server's clock less the clients' (never above 0, and it
	// only falls); for stall more steps (commands, or time steps that pass
	// for the clients only) the server's clock stands still.
	skew  time.Duration
	stall int
}

func newSimWorld(m *miniredis.Miniredis, exec redis.Conn, clients int, names map[string]string) *simWorld {
	w := &simWorld{m: m, exec: exec, dead: map[int]bool{}, names: names}
	w.cond = sync.NewCond(&w.mu)
	w.now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(w.now)
	for i := 0; i < clients; i++ {
		w.pools = append(w.pools, &simPool{w: w, client: i})
	}
	return w
}

// srvNow is the server's clock (mu held).
func (w *simWorld) srvNow() time.Time { return w.now.Add(w.skew) }

// srvMs is the server's clock in ms, as the scripts' now_ms (mu held).
func (w *simWorld) srvMs() float64 { return float64(w.srvNow().UnixMilli()) }

// tick moves the clients' clock by d, and the server's with it unless it
// stands still; ttls says whether keys' expiry moves too (mu held).
func (w *simWorld) tick(d time.Duration, ttls bool) {
	w.now = w.now.Add(d)
	switch {
	case w.stall > 0:
		w.stall--
		w.skew -= d
	case ttls && d > 0:
		w.m.FastForward(d)
	}
	w.m.SetTime(w.srvNow())
}

// stepBack sets the server's clock back by d; keys expire that much later,
// as Redis's absolute expiry times do (mu held).
func (w *simWorld) stepBack(d time.Duration) {
	w.skew -= d
	for _, key := range w.m.Keys() {
		if ttl := w.m.TTL(key); ttl > 0 {
			w.m.SetTTL(key, ttl+d)
		}
	}
	w.m.SetTime(w.srvNow())
}

// park marks the calling goroutine as waiting on the scheduler (mu held).
func (w *simWorld) park() {
	w.running--
	w.cond.Broadcast()
}

// The timeSource of the world.

func (w *simWorld) Now() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

func (w *simWorld) AfterFunc(d time.Duration, f func()) engine.Timer {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := &simTimer{w: w, at: w.now.Add(d), f: f}
	w.timers = append(w.timers, t)
	return t
}

func (w *simWorld) WaitOrDone(ctx context.Context, done <-chan struct{}, d time.Duration) {
	w.mu.Lock()
	if ctx.Err() != nil {
		w.mu.Unlock()
		return
	}
	sw := &simWait{ctx: ctx, done: done, at: w.now.Add(d), wake: make(chan struct{})}
	if d == engine.Forever {
		sw.at = time.Time{}
	}
	w.waits = append(w.waits, sw)
	w.park()
	w.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
	case <-sw.wake:
	}
	w.mu.Lock()
	if !sw.woken {
		sw.woken = true
		w.running++
	}
	for i, x := range w.waits {
		if x == sw {
			w.waits = append(w.waits[:i], w.waits[i+1:]...)
			break
		}
	}
	w.mu.Unlock()
}

func (w *simWorld) Go(f func()) {
	w.mu.Lock()
	w.running++
	w.mu.Unlock()
	go func() {
		defer func() {
			w.mu.Lock()
			w.running--
			w.cond.Broadcast()
			w.mu.Unlock()
		}()
		f()
	}()
}

// quiesce waits until every goroutine of the world is parked or finished.
// A goroutine blocked outside the world (a mutex, a channel the world does
// not know) would hang the explorer: that is reported after a while.
func (w *simWorld) quiesce() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	start := time.Now()
	for w.running > 0 || w.waitRunnable() || w.cancelRead() {
		if time.Since(start) > 20*time.Second {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			return fmt.Errorf("explorer: %d goroutines of the world never parked (blocked outside the simulation?)\n%s", w.running, buf[:n])
		}
		// Wake up now and then to re-check waitRunnable and the time limit.
		t := time.AfterFunc(50*time.Millisecond, func() { w.mu.Lock(); w.cond.Broadcast(); w.mu.Unlock() })
		w.cond.Wait()
		t.Stop()
	}
	return nil
}

// waitRunnable reports a goroutine in WaitOrDone whose channel closed or
// whose context ended: it is about to run.
func (w *simWorld) waitRunnable() bool {
	for _, sw := range w.waits {
		if sw.woken {
			continue
		}
		select {
		case <-sw.done:
			return true
		default:
		}
		if sw.ctx.Err() != nil {
			return true
		}
	}
	return false
}

// cancelRead ends one read parked under a context the client cancelled
// (its connection closes, as redigo's DoContext does), and reports whether
// it did: one at a time, once all else is quiet, so runs replay.
func (w *simWorld) cancelRead() bool {
	for _, c := range w.sortedConns() {
		if c.recv != nil && errors.Is(c.recvCtx.Err(), context.Canceled) {
			c.closed = true
			c.breakLocked(c.recvCtx.Err())
			return true
		}
	}
	return false
}

// execute runs c's next command at the server (mu held).
func (w *simWorld) execute(c *simConn) string {
	cmd := c.inbox[0]
	label := w.cmdLabel(cmd)
	switch strings.ToUpper(cmd.name) {
	case "BLMOVE", "BLPOP":
		if v, ok := w.tryBlocking(cmd); ok {
			c.inbox = c.inbox[1:]
			c.replies = append(c.replies, simReply{v: v})
			w.serveBlocked()
			return label + " (served at once)"
		}
		secs, _ := strconv.ParseFloat(fmt.Sprint(cmd.args[len(cmd.args)-1]), 64)
		c.blocked = true
		w.seq++
		c.blockSeq = w.seq
		c.blockUntil = time.Time{}
		if secs > 0 {
			c.blockUntil = w.srvNow().Add(time.Duration(secs * float64(time.Second)))
		}
		return label + " (blocks)"
	}
	v, err := w.exec.Do(cmd.name, cmd.args...)
	if err != nil && !engine.IsRedisError(err) {
		panic(fmt.Sprintf("explorer: miniredis connection failed: %v", err))
	}
	c.inbox = c.inbox[1:]
	c.replies = append(c.replies, simReply{v: v, err: err})
	w.serveBlocked()
	if err != nil {
		label += " -> " + err.Error()
	}
	return label
}

// tryBlocking runs the non-blocking form of a blocking command.
func (w *simWorld) tryBlocking(cmd simCmd) (interface{}, bool) {
	var v interface{}
	var err error
	switch strings.ToUpper(cmd.name) {
	case "BLMOVE":
		a := cmd.args
		v, err = w.exec.Do("LMOVE", a[0], a[1], a[2], a[3])
	case "BLPOP":
		v, err = w.exec.Do("LPOP", cmd.args[0])
		if err == nil && v != nil {
			v = []interface{}{[]byte(fmt.Sprint(cmd.args[0])), v}
		}
	}
	if err != nil {
		// A key of the wrong type: Redis answers the blocking command with
		// the error at once.
		return err, true
	}
	return v, v != nil
}

// serveBlocked serves blocked commands in the order they blocked, as
// Redis does right after a write made their list non-empty (mu held).
func (w *simWorld) serveBlocked() {
	for {
		var first *simConn
		for _, c := range w.conns {
			if c.blocked && c.broken == nil && (first == nil || c.blockSeq < first.blockSeq) {
				if _, ok := w.peekBlocking(c.inbox[0]); ok {
					first = c
				}
			}
		}
		if first == nil {
			return
		}
		label := w.cmdLabel(first.inbox[0])
		v, _ := w.tryBlocking(first.inbox[0])
		first.blocked = false
		first.inbox = first.inbox[1:]
		if e, ok := v.(error); ok {
			first.replies = append(first.replies, simReply{err: e})
		} else {
			first.replies = append(first.replies, simReply{v: v})
		}
		w.log = append(w.log, "    "+first.name()+" "+label+" served")
	}
}

// peekBlocking reports whether a blocking command could be served now.
func (w *simWorld) peekBlocking(cmd simCmd) (int, bool) {
	n, err := redis.Int(w.exec.Do("LLEN", cmd.args[0]))
	return n, err == nil && n > 0
}

// cmdLabel names a command for the schedule.
func (w *simWorld) cmdLabel(cmd simCmd) string {
	switch strings.ToUpper(cmd.name) {
	case "EVALSHA", "EVAL":
		// By its hash (EVALSHA) or its source (EVAL, after NOSCRIPT).
		if n, ok := w.names[fmt.Sprint(cmd.args[0])]; ok {
			return n
		}
		return "script"
	case "BLMOVE":
		return "BLMOVE"
	case "BLPOP":
		return "BLPOP"
	}
	return strings.ToUpper(cmd.name)
}

// advanceTo moves the clients' clock to t, and the server's with it unless
// it stands still (mu held): blocked commands whose timeout passed get a
// nil reply, lease timers and WaitOrDone fire.
func (w *simWorld) advanceTo(t time.Time) (fire []func()) {
	// Keys with a TTL (an idle semaphore's, doorbells) expire as time passes.
	w.tick(t.Sub(w.now), true)
	srv := w.srvNow()
	for _, c := range w.conns {
		if c.blocked && !c.blockUntil.IsZero() && !c.blockUntil.After(srv) {
			c.blocked = false
			c.inbox = c.inbox[1:]
			c.replies = append(c.replies, simReply{v: nil})
		}
	}
	for _, tm := range w.timers {
		if !tm.off && !tm.at.After(t) {
			tm.off = true
			fire = append(fire, tm.f)
		}
	}
	for _, sw := range w.waits {
		if !sw.woken && !sw.at.IsZero() && !sw.at.After(t) {
			sw.woken = true
			w.running++
			close(sw.wake)
		}
	}
	return fire
}

// nextEvent is the earliest timed event after now, by the clients' clock: a
// blocked command's timeout, a lease timer, a WaitOrDone, or a deadline in
// the server's leases or waits sorted sets (extra). The server's times are
// mapped by the skew of now (while its clock stands still, a time step
// reaches them on the clients' clock only).
func (w *simWorld) nextEvent(extra []time.Time) (time.Time, bool) {
	var best time.Time
	soon := w.now.Add(time.Microsecond)
	consider := func(t time.Time) {
		if t.After(w.now) && (best.IsZero() || t.Before(best)) {
			best = t
		}
	}
	for _, c := range w.conns {
		if c.blocked && !c.blockUntil.IsZero() {
			// Commands take virtual time too (10µs each), so a timeout can
			// fall behind the clock: Redis times such a command out at its
			// next tick, here a microsecond on.
			consider(maxTime(c.blockUntil.Add(-w.skew), soon))
		}
	}
	// A timer or a WaitOrDone can fall behind the clock the same way
	// (commands ran after it was set): it fires a microsecond on too.
	for _, tm := range w.timers {
		if !tm.off {
			consider(maxTime(tm.at, soon))
		}
	}
	for _, sw := range w.waits {
		if !sw.woken && !sw.at.IsZero() {
			consider(maxTime(sw.at, soon))
		}
	}
	for _, t := range extra {
		consider(t)
	}
	return best, !best.IsZero()
}

// quiet reports a quiet point: no command waits to run at the server, no
// reply waits to be read, no goroutine waits at a failpoint; only time (or
// a fault) can move the world (mu held).
func (w *simWorld) quiet() bool {
	if len(w.points) > 0 {
		return false
	}
	for _, c := range w.conns {
		if c.broken == nil && (len(c.replies) > 0 || len(c.inbox) > 0 && !c.blocked) {
			return false
		}
	}
	return true
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// sortedConns returns the world's live connections in a stable order.
func (w *simWorld) sortedConns() []*simConn {
	cs := append([]*simConn(nil), w.conns...)
	sort.SliceStable(cs, func(i, j int) bool {
		if cs[i].client != cs[j].client {
			return cs[i].client < cs[j].client
		}
		return cs[i].id < cs[j].id
	})
	return cs
}
