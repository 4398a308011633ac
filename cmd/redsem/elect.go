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
)

const electHelp = `Usage: redsem elect [flags] NAME -- COMMAND [ARGS...]
       redsem elect [flags] NAME -c 'SHELL COMMAND'

Campaigns in the election NAME and runs COMMAND only while leading: waits
its turn (campaigners are served first come, first served), runs COMMAND
once elected, keeps the leadership while COMMAND runs, resigns when COMMAND
exits, and exits with COMMAND's exit code. "Exactly one of us runs this"
for a scheduler or a queue consumer: start it on every machine, and one
runs while the others wait to take over. redsem leader NAME shows who leads.

  -w, --wait, --timeout SECONDS
                        campaign at most this long (seconds, or a duration
                        like 2m). Default: as long as it takes
  -E, --conflict-exit-code CODE
                        exit code when not elected within -w (default 1)
  -c, --command STRING  run STRING with /bin/sh -c instead of COMMAND ARGS
  --value TEXT          what redsem leader shows for this leader (default
                        "host:pid command")
  --ttl DURATION        the leadership's lease (default 30s), refreshed every
                        TTL/3: if redsem dies, the next campaigner leads
                        within the TTL
  --kill-after DURATION time between TERM and KILL once the leadership is
                        lost (default 5s)
  --lost-exit-code CODE exit code when the leadership was lost (default 75)
  -v, --verbose         say on stderr when elected

` + connHelp + `
The command runs in its own process group, as with redsem run, with
REDSEM_NAME and REDSEM_TERM set: the leadership's term, above every earlier
leader's. Pass it with your writes so the resource can refuse a stalled old
leader. Signals are forwarded as by redsem run. If the leadership is lost,
the group gets TERM, then KILL after --kill-after, and redsem exits 75.

Exit codes: the command's own; 1 not elected within -w (see -E); 64 usage;
65 bad state; 69 Redis unavailable; 75 leadership lost; 126 command not
executable; 127 command not found; 128+N killed by signal N.

Examples:
  redsem elect scheduler -- ./scheduler
  redsem elect -w 60 --value "$(hostname)" nightly -c 'make nightly'
`

// parseElectArgs parses elect's flags into the options supervise takes.
func parseElectArgs(args []string) (*runOptions, error) {
	o := &runOptions{busyCode: exitBusy, lostCode: exitLost, size: 1}
	fs := newFlagSet("elect")
	o.conn.register(fs)
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
	fs.Var(&o.ttl, "ttl", "")
	fs.Var(&o.killAfter, "kill-after", "")
	fs.IntVar(&o.lostCode, "lost-exit-code", exitLost, "")
	fs.StringVar(&o.label, "value", "", "")
	pos, rest, err := scanArgs(fs, args, electHelp, 1)
	if err != nil {
		return nil, err
	}
	if len(pos) == 0 {
		return nil, usagef("elect: missing NAME: redsem elect [flags] NAME -- COMMAND [ARGS...] (see redsem elect --help)")
	}
	o.name, o.argv = pos[0], rest
	switch {
	case shell != "" && len(o.argv) > 0:
		return nil, usagef("elect: give either -c STRING or a command after --, not both")
	case shell != "":
		o.argv = []string{"/bin/sh", "-c", shell}
	case len(o.argv) == 0:
		return nil, usagef("elect: missing command: redsem elect [flags] NAME -- COMMAND [ARGS...]")
	}
	for _, c := range []struct {
		flag string
		code int
	}{{"-E", o.busyCode}, {"--lost-exit-code", o.lostCode}} {
		if c.code < 0 || c.code > 255 {
			return nil, usagef("elect: %s %d is not an exit code (0-255)", c.flag, c.code)
		}
	}
	if !o.killAfter.set {
		o.killAfter.d = 5 * time.Second
	}
	if o.wait.set && o.wait.d == 0 {
		return nil, usagef("elect: -w 0 would never wait for the leader to go; give a wait above 0")
	}
	if o.label == "" {
		host, _ := os.Hostname()
		o.label = fmt.Sprintf("%s:%d %s", host, os.Getpid(), filepath.Base(o.argv[0]))
	}
	return o, nil
}

func cmdElect(args []string, _, stderr io.Writer) error {
	o, err := parseElectArgs(args)
	if err != nil {
		return err
	}
	p, err := connect(o.conn)
	if err != nil {
		return err
	}
	defer p.Close()
	label := o.label
	if len(label) > maxLabelLen {
		label = label[:maxLabelLen]
	}
	opts := []redsem.Option{redsem.WithPrefix(o.conn.prefix), redsem.WithLabel(label), redsem.WithBlockingPool(p.block)}
	if o.ttl.set {
		opts = append(opts, redsem.WithTTL(o.ttl.d))
	}
	e, err := redsem.NewElection(p.main, o.name, opts...)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	tstp := make(chan os.Signal, 1) // as run: a stopped redsem cannot keep leading
	signal.Notify(tstp, syscall.SIGTSTP)
	defer signal.Stop(tstp)

	started := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.wait.set {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, o.wait.d)
		defer stop()
	}
	lead, err := waitOrSignal(ctx, func(ctx context.Context) (*redsem.Leadership, error) {
		return e.Campaign(ctx, o.label)
	}, func(l *redsem.Leadership) { resign(l) }, sigs)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		if o.verbose {
			return exitf(o.busyCode, "not elected in %q within %v", o.name, o.wait.d)
		}
		return exitf(o.busyCode, "")
	case err != nil:
		return err
	}
	if o.verbose {
		fmt.Fprintf(stderr, "redsem: leading %q after %v, term %d\n", o.name, time.Since(started).Round(time.Millisecond), lead.Term())
	}
	return supervise(leading{lead}, []string{"REDSEM_TERM=" + strconv.FormatInt(lead.Term(), 10)}, o, sigs, stderr)
}

func resign(l *redsem.Leadership) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_ = l.Resign(ctx)
}

// leading is a leadership as supervise holds it: its Context's end is the
// lease's, and Release resigns.
type leading struct{ l *redsem.Leadership }

func (h leading) Valid() bool                       { return h.l.Valid() }
func (h leading) Done() <-chan struct{}             { return h.l.Context().Done() }
func (h leading) Release(ctx context.Context) error { return h.l.Resign(ctx) }

func (h leading) Err() error {
	if h.l.Context().Err() == nil {
		return nil
	}
	return context.Cause(h.l.Context())
}

// waitOrSignal runs get under ctx, which a signal from sigs cancels: then
// it returns exit code 128+N, and gives back with undo whatever get was
// granted meanwhile.
func waitOrSignal[T any](ctx context.Context, get func(context.Context) (T, error), undo func(T),
	sigs <-chan os.Signal) (T, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := get(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case s := <-sigs:
		cancel()
		r := <-done
		if r.err == nil {
			undo(r.v)
		}
		var zero T
		return zero, exitf(exitSignalBase+int(s.(syscall.Signal)), "")
	}
}
