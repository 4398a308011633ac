//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/rate"
)

const runHelp = `Usage: redsem run [flags] NAME -- COMMAND [ARGS...]
       redsem run [flags] NAME -c 'SHELL COMMAND'
       redsem run --rate N/PER [flags] NAME -- COMMAND [ARGS...]

Waits for the lock NAME, runs COMMAND while holding it, refreshes the lease
while COMMAND runs, releases it when COMMAND exits, and exits with COMMAND's
exit code. Like flock(1), but across machines: by default (-x) the write side
of the read-write lock NAME, alone; with -s its read side, shared with other
-s holders; with --size N, one of the N slots of semaphore NAME.

Waiting (flock's flags keep their meaning):
  -n, --nonblock        fail at once if no slot is free
  -w, --wait, --timeout SECONDS
                        wait at most this long (seconds, or a duration like 2m);
                        0 means do not wait. Default: wait as long as it takes
  -E, --conflict-exit-code CODE
                        exit code when no slot was had (default 1); busy is
                        silent unless -v, as with flock
  -c, --command STRING  run STRING with /bin/sh -c instead of COMMAND ARGS
  -x, -e, --exclusive   the write side: no other holder at all (the default)
  -s, --shared          the read side: any number of -s holders at once, no
                        -x holder. Waiters are served in arrival order: a
                        waiting -x is not overtaken by later -s
  One-letter flags may be bundled: -nw 5 is -n -w 5.

Semaphore:
  --size N              one of the N slots of semaphore NAME instead of the
                        lock (--size 1: the mutex NAME, which redsem status,
                        reclaim and delete show and act on; a semaphore and a
                        lock of one name are apart). Every user of NAME must
                        give the same size; -n is NOT the size (it is flock's
                        non-blocking flag). redsem resize changes it
  --adopt-size          follow the size stored in Redis instead of failing
                        with exit 65 when it differs from --size (after a
                        redsem resize); --size then only creates NAME
  --ttl DURATION        lease time to live (default 30s). The lease is
                        refreshed every TTL/3; if redsem dies, its slot frees
                        itself within the TTL
  --label TEXT          holder label shown by status (default "host:pid command")
  --idle-expiry DURATION
                        let the semaphore's keys expire once it has been idle
                        (no holder, no waiter) this long; the next use creates
                        it again (default: never; at least 100ms; not for the
                        lock: needs --size or --adopt-size)

Rate gate:
  --rate N/PER          wait for a start of rate gate NAME (at most N starts
                        in any window of PER, across every machine: 5/s,
                        100/1m, 20/250ms) before running COMMAND, and take no
                        lock: nothing is held while it runs. Repeat it for a
                        quota of several limits. With --size, take the slot
                        first, then the start (at most N starts per PER, and
                        at most SIZE commands at once). -n and -w apply to
                        the start as to a slot; REDSEM_RATE_AT is the start's
                        grant time (Redis TIME, RFC 3339). redsem rate set
                        changes the limits for every client

Losing the lease:
  --kill-after DURATION time between TERM and KILL once the lease is lost
                        (default 5s)
  --lost-exit-code CODE exit code when the lease was lost (default 75)
  -v, --verbose         say on stderr when the slot is taken, and when busy

` + connHelp + `
The command runs in its own process group with these variables set:
  REDSEM_NAME, REDSEM_SIZE, REDSEM_TOKEN, REDSEM_SLOT (1..size; for the lock,
  "r" with -s, else "w") and REDSEM_FENCE (a number that grows with every
  acquisition, a writer's above every earlier reader's: pass it with your
  writes so the resource can refuse a stale holder).
INT, TERM, HUP, QUIT, USR1 and USR2 sent to redsem are forwarded to the whole
group; Ctrl-Z (TSTP) is ignored. Run from a terminal (Linux), the group has
the terminal's foreground while the command runs, as under flock(1): it
reads what is typed, Ctrl-C reaches it, and Ctrl-Z does not stop it. If the
lease is lost, the group gets TERM, then KILL after
--kill-after, and redsem exits 75. If redsem is killed (even with kill -9),
the command's group is killed too.

Exit codes: the command's own; 1 no slot (-n, -w; see -E); 64 usage;
65 size mismatch or bad state; 69 Redis unavailable; 75 lease lost;
126 command not executable; 127 command not found; 128+N killed by signal N.

Examples:
  # crontab: flock -n /var/lock/backup.lock /usr/local/bin/backup.sh
  */5 * * * * REDIS_URL=redis://redis.internal/0 redsem run -n backup -- /usr/local/bin/backup.sh
  # many report jobs read the index at once; a rebuild runs alone
  redsem run -s index -- ./report.sh
  redsem run -x index -- ./rebuild-index.sh
  # at most 4 encoders across the fleet, wait up to 10 minutes for a slot
  redsem run --size 4 -w 600 encoders -- ffmpeg -i in.mov out.mp4
  # flock -c style, with a 2-minute lease
  redsem run --ttl 2m -E 0 reports -c 'make reports && upload reports/*'
  # cron jobs on many machines that may call the partner API 10 times a minute
  redsem run --rate 10/1m partner-api -- ./sync.sh
`

// runOptions are the parsed flags and arguments of run.
type runOptions struct {
	conn      connFlags
	name      string
	argv      []string
	nonblock  bool
	wait      durationValue
	busyCode  int
	lostCode  int
	size      int
	adoptSize bool
	ttl       durationValue
	idle      durationValue // --idle-expiry
	killAfter durationValue
	label     string
	verbose   bool
	shared    bool // -s: the read side of the lock
	sizeSet   bool // --size was given
	rates     limitsValue
}

// locked reports whether run takes a side of the read-write lock NAME
// (the default) rather than a slot of semaphore NAME (--size, --adopt-size)
// or only a start of rate gate NAME (--rate alone).
func (o *runOptions) locked() bool { return !o.sem() && len(o.rates.ls) == 0 }

// sem reports whether run takes a slot of semaphore NAME.
func (o *runOptions) sem() bool { return o.sizeSet || o.adoptSize }

func parseRunArgs(args []string) (*runOptions, error) {
	o := &runOptions{busyCode: exitBusy, lostCode: exitLost, size: 1,
		ttl: durationValue{min: redsem.MinTTL, max: redsem.MaxTTL}}
	fs := newFlagSet("run")
	o.conn.register(fs)
	for _, n := range []string{"n", "nonblock"} {
		fs.BoolVar(&o.nonblock, n, false, "")
	}
	for _, n := range []string{"w", "wait", "timeout"} {
		fs.Var(&o.wait, n, "")
	}
	for _, n := range []string{"E", "conflict-exit-code"} {
		fs.IntVar(&o.busyCode, n, exitBusy, "")
	}
	var shell string
	for _, n := range []string{"c", "command"} {
		fs.StringVar(&shell, n, "", "")
	}
	for _, n := range []string{"v", "verbose"} {
		fs.BoolVar(&o.verbose, n, false, "")
	}
	fs.Var(&sizeValue{n: &o.size, set: &o.sizeSet}, "size", "")
	fs.BoolVar(&o.adoptSize, "adopt-size", false, "")
	// flock's -x/--exclusive (and -e) is the default; -s/--shared the read
	// side.
	var exclusive bool
	for _, n := range []string{"x", "e", "exclusive"} {
		fs.BoolVar(&exclusive, n, false, "")
	}
	for _, n := range []string{"s", "shared"} {
		fs.BoolVar(&o.shared, n, false, "")
	}
	fs.Var(&o.ttl, "ttl", "")
	fs.Var(&o.idle, "idle-expiry", "")
	fs.Var(&o.killAfter, "kill-after", "")
	fs.IntVar(&o.lostCode, "lost-exit-code", exitLost, "")
	fs.StringVar(&o.label, "label", "", "")
	fs.Var(&o.rates, "rate", "")

	// Flags may come before and after NAME; the command starts after "--"
	// or at the first argument after NAME that is not a flag.
	pos, rest, err := scanArgs(fs, args, runHelp, 1)
	if err != nil {
		return nil, err
	}
	if len(pos) == 0 {
		// "redsem run -- echo hi" must not take echo for the NAME.
		return nil, usagef("run: missing NAME: redsem run [flags] NAME -- COMMAND [ARGS...] (see redsem run --help)")
	}
	o.name, o.argv = pos[0], rest
	switch {
	case shell != "" && len(o.argv) > 0:
		return nil, usagef("run: give either -c STRING or a command after --, not both")
	case shell != "":
		o.argv = []string{"/bin/sh", "-c", shell}
	case len(o.argv) == 0:
		return nil, usagef("run: missing command: redsem run [flags] NAME -- COMMAND [ARGS...]")
	}
	if len(o.argv) >= 2 && o.argv[1] == "--" && o.nonblock {
		if _, err := strconv.Atoi(o.name); err == nil {
			return nil, usagef("run: -n is flock's non-blocking flag, not the size; use --size %s %s", o.name, o.argv[0])
		}
	}
	for _, c := range []struct {
		flag string
		code int
	}{{"-E", o.busyCode}, {"--lost-exit-code", o.lostCode}} {
		if c.code < 0 || c.code > 255 {
			return nil, usagef("run: %s %d is not an exit code (0-255)", c.flag, c.code)
		}
	}
	switch {
	case o.shared && exclusive:
		return nil, usagef("run: -s (shared) and -x (exclusive) exclude each other")
	case len(o.rates.ls) > 0 && (o.shared || exclusive):
		return nil, usagef("run: --rate takes no lock: it does not go with -s or -x (add --size N for a slot as well)")
	case o.shared && !o.locked():
		return nil, usagef("run: -s takes the read side of the lock NAME, which has no --size or --adopt-size")
	case o.idle.set && !o.sem():
		return nil, usagef("run: --idle-expiry applies to a semaphore (--size or --adopt-size), not to the lock NAME or a rate gate")
	}
	if !o.killAfter.set {
		o.killAfter.d = 5 * time.Second
	}
	if o.wait.set && o.wait.d == 0 {
		o.nonblock = true
	}
	if o.label == "" {
		host, _ := os.Hostname()
		o.label = fmt.Sprintf("%s:%d %s", host, os.Getpid(), filepath.Base(o.argv[0]))
		if len(o.label) > maxLabelLen {
			o.label = o.label[:maxLabelLen]
		}
	}
	return o, nil
}

// forwarded are the signals redsem passes on to the command's group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP,
	syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

func cmdRun(args []string, _, stderr io.Writer) error {
	o, err := parseRunArgs(args)
	if err != nil {
		return err
	}
	p, err := connect(o.conn)
	if err != nil {
		return err
	}
	defer p.Close()
	opts := []redsem.Option{
		redsem.WithPrefix(o.conn.prefix), redsem.WithLabel(o.label),
		redsem.WithAutoRefresh(), redsem.WithBlockingPool(p.block),
	}
	if o.ttl.set {
		opts = append(opts, redsem.WithTTL(o.ttl.d))
	}
	if o.adoptSize {
		opts = append(opts, redsem.WithAdoptSize())
	}
	if o.idle.set {
		opts = append(opts, redsem.WithIdleExpiry(o.idle.d))
	}
	var q *rate.Quota
	if len(o.rates.ls) > 0 {
		if q, err = rate.NewQuota(p.main, o.name, o.rates.ls, rate.WithPrefix(o.conn.prefix), rate.WithBlockingPool(p.block)); err != nil {
			return err
		}
	}
	var lk locker
	switch {
	case !o.locked() && !o.sem():
		// --rate alone: no lock.
	case o.locked():
		m, err := redsem.NewRWMutex(p.main, o.name, opts...)
		if err != nil {
			return err
		}
		lk = locker{try: m.TryLock, wait: m.Lock}
		if o.shared {
			lk = locker{try: m.TryRLock, wait: m.RLock}
		}
	default:
		sem, err := redsem.NewSemaphore(p.main, o.name, o.size, opts...)
		if err != nil {
			return err
		}
		ops, err := admin.New(p.main, o.conn.prefix, o.name)
		if err != nil {
			return err
		}
		lk = locker{try: sem.TryAcquire, wait: sem.Acquire, ops: ops}
	}
	// From here on a signal must not kill redsem: while it waits, it gives
	// up the wait; while the command runs, it is forwarded.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	// Ctrl-Z must not stop redsem: a stopped redsem cannot refresh its lease
	// while its command runs on. Caught and dropped (not ignored, which the
	// command would inherit).
	tstp := make(chan os.Signal, 1)
	signal.Notify(tstp, syscall.SIGTSTP)
	defer signal.Stop(tstp)

	started := time.Now()
	var lease *redsem.Lease
	if lk.try != nil {
		if lease, err = acquire(lk, o, sigs); err != nil {
			return err
		}
	}
	var env []string
	if q != nil {
		st, err := takeStart(q, o, sigs, started)
		if err != nil {
			if lease != nil {
				// Nothing is held when no start was had (rate.WaitHolding).
				rctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				_ = lease.Release(rctx)
				cancel()
			}
			return err
		}
		env = append(env, "REDSEM_RATE_AT="+st.At.UTC().Format(time.RFC3339Nano))
		if o.verbose {
			fmt.Fprintf(stderr, "redsem: started under rate gate %q (%s) after %v\n", o.name, o.rates.String(),
				time.Since(started).Round(time.Millisecond))
		}
	}
	if lease == nil {
		return supervise(nil, env, o, sigs, stderr)
	}
	if ops := lk.ops; o.adoptSize {
		// The size in force, for REDSEM_SIZE and the messages: the stored
		// one, which may differ from --size.
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		if st, err := ops.Status(ctx); err == nil && st.Exists {
			o.size = st.Size
		}
		cancel()
	}
	if o.verbose {
		what := fmt.Sprintf("slot %s of %d of %q", slotOf(lease.Token()), o.size, o.name)
		if o.locked() {
			what = fmt.Sprintf("the %s side of lock %q", map[bool]string{true: "read", false: "write"}[o.shared], o.name)
		}
		fmt.Fprintf(stderr, "redsem: holding %s after %v, fence %d\n",
			what, time.Since(started).Round(time.Millisecond), lease.Fence())
	}
	return supervise(lease, append(leaseEnv(lease, o), env...), o, sigs, stderr)
}

// sizeValue is --size: an int that remembers it was given (the flags are
// set through their Values, which the FlagSet does not track).
type sizeValue struct {
	n   *int
	set *bool
}

func (v *sizeValue) String() string {
	if v.n == nil {
		return "1"
	}
	return strconv.Itoa(*v.n)
}

func (v *sizeValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not a whole number")
	}
	if n < 1 || n > redsem.MaxSize {
		return fmt.Errorf("not between 1 and %d", redsem.MaxSize)
	}
	*v.n, *v.set = n, true
	return nil
}

// locker is what run takes: a side of the lock, or a slot of the semaphore
// (ops reads its size).
type locker struct {
	try, wait func(context.Context) (*redsem.Lease, error)
	ops       *admin.Handle
}

// maxLabelLen is the longest holder label redsem.WithLabel takes.
const maxLabelLen = 256

// acquire waits for a slot as the flags say. A signal while waiting ends
// the wait with exit code 128+N; no slot is kept.
func acquire(lk locker, o *runOptions, sigs <-chan os.Signal) (*redsem.Lease, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.wait.set && o.wait.d > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, o.wait.d)
		defer stop()
	}
	type result struct {
		lease *redsem.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if o.nonblock {
			r.lease, r.err = lk.try(ctx)
		} else {
			r.lease, r.err = lk.wait(ctx)
		}
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case s := <-sigs:
		cancel()
		r = <-done
		if r.lease != nil {
			rctx, rcancel := context.WithTimeout(context.Background(), opTimeout)
			_ = r.lease.Release(rctx)
			rcancel()
		}
		return nil, exitf(exitSignalBase+int(s.(syscall.Signal)), "")
	}
	switch {
	case r.err == nil:
		return r.lease, nil
	case errors.Is(r.err, redsem.ErrNoToken), errors.Is(r.err, context.DeadlineExceeded):
		if o.verbose {
			how := "no slot free"
			if !o.nonblock {
				how = fmt.Sprintf("no slot within %v", o.wait.d)
			}
			if o.locked() {
				return nil, exitf(o.busyCode, "%s: lock %q is held", how, o.name)
			}
			return nil, exitf(o.busyCode, "%s of %q (size %d)", how, o.name, o.size)
		}
		return nil, exitf(o.busyCode, "")
	case errors.Is(r.err, redsem.ErrSizeMismatch):
		return nil, fmt.Errorf("%w (every user of a name must give the same --size, or --adopt-size to follow the stored one; redsem resize changes it)", r.err)
	default:
		return nil, r.err
	}
}

// takeStart waits for a start of the rate gate as the flags say: -n takes
// one now or none (AllowN), -w waits at most what is left of the wait that
// began at began. A signal while waiting ends the wait with exit code
// 128+N. Each start takes one unit of every limit.
func takeStart(q *rate.Quota, o *runOptions, sigs <-chan os.Signal, began time.Time) (rate.Start, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.wait.set && o.wait.d > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, began.Add(o.wait.d))
		defer stop()
	}
	units := make([]int, len(o.rates.ls))
	for i := range units {
		units[i] = 1
	}
	type result struct {
		st  rate.Start
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if o.nonblock {
			r.st, r.err = q.AllowN(ctx, units...)
		} else {
			r.st, r.err = q.WaitN(ctx, units...)
		}
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case s := <-sigs:
		cancel()
		<-done // a start granted meanwhile is spent: the rule still holds
		return rate.Start{}, exitf(exitSignalBase+int(s.(syscall.Signal)), "")
	}
	var limited *rate.LimitedError
	switch {
	case r.err == nil:
		return r.st, nil
	case errors.As(r.err, &limited):
		if o.verbose {
			return rate.Start{}, exitf(o.busyCode, "no start now under rate gate %q (%s); the next in %v",
				o.name, o.rates.String(), limited.RetryAfter.Round(time.Millisecond))
		}
		return rate.Start{}, exitf(o.busyCode, "")
	case errors.Is(r.err, context.DeadlineExceeded):
		if o.verbose {
			return rate.Start{}, exitf(o.busyCode, "no start within %v under rate gate %q (%s)", o.wait.d, o.name, o.rates.String())
		}
		return rate.Start{}, exitf(o.busyCode, "")
	case errors.Is(r.err, rate.ErrRateMismatch):
		return rate.Start{}, fmt.Errorf("%w (give --rate the limits stored, see redsem rate status; redsem rate set changes them for every client)", r.err)
	}
	return rate.Start{}, r.err
}
