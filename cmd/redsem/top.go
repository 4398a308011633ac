//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/redsem/redsem/admin"
)

const topHelp = `Usage: redsem top [--interval D] [-n N] [--limit N] [--max-scan N] [--plain] [--json] [connection flags]

A live view of every semaphore, mutex, read-write lock, rate gate and
election under the prefix, found by SCAN over their meta keys and read one
script call each, refreshed every --interval and sorted by saturation
(held/size, then waiters). On a terminal the view is redrawn in place;
otherwise (a pipe, a file, --plain) each refresh prints a time line and one
plain line per name. Stop it with q or Ctrl-C.

Columns: NAME, KIND (sem, mutex, rw, rate, elect), HELD (rw: readers and
writer; rate: starts in the current window), SIZE (rate: starts allowed per
interval; rw: -), SAT (HELD/SIZE; rw: 100% while a writer holds), WAIT
(waiters), FREE (rate: starts possible now), EXP (leases expired, not yet
reclaimed), STRAY (stray tokens), OLDEST (age of the oldest lease; rate: the
interval).

  --interval D     time between refreshes (default 1s)
  -n N             stop after N refreshes (default 0: until interrupted)
  --limit N        show at most N names (default 1000)
  --max-scan N     send at most N SCAN calls (COUNT 500) per refresh (default 100);
                   a keyspace larger than that is not walked whole
  --plain          plain lines even on a terminal
  --json           one JSON document per refresh instead of the view:
                   "prefix", "truncated", "names" (each name's
                   status --json document) and "failed"; top -n 1 --json is
                   one report

` + connHelp + `
Examples:
  redsem top
  redsem top --prefix myapp: --interval 5s
  redsem top -n 1 | sort -k4 -n
  redsem top -n 1 --json | jq '.names[] | select(.waiting > 0) | .name'
`

// topOptions are the flags of top.
type topOptions struct {
	interval durationValue
	n        int
	limit    int
	maxScan  int
	plain    bool
	json     bool
}

func cmdTop(args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("top")
	var c connFlags
	c.register(fs)
	o := topOptions{interval: durationValue{d: time.Second}}
	fs.Var(&o.interval, "interval", "")
	fs.IntVar(&o.n, "n", 0, "")
	fs.IntVar(&o.limit, "limit", admin.DefaultScanLimit, "")
	fs.IntVar(&o.maxScan, "max-scan", admin.DefaultMaxScan, "")
	fs.BoolVar(&o.plain, "plain", false, "")
	fs.BoolVar(&o.json, "json", false, "")
	pos, err := parseArgs(fs, args, topHelp)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("top: no arguments expected, got %q (see redsem top --help)", strings.Join(pos, " "))
	case o.interval.d < 10*time.Millisecond:
		return usagef("top: --interval must be at least 10ms, not %s", o.interval.String())
	case o.n < 0:
		return usagef("top: -n must be at least 0, not %d", o.n)
	case o.limit < 1:
		return usagef("top: --limit must be at least 1, not %d", o.limit)
	case o.maxScan < 1:
		return usagef("top: --max-scan must be at least 1, not %d", o.maxScan)
	case o.json && o.plain:
		return usagef("top: --json and --plain exclude each other")
	}
	p, err := connect(c)
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t := &topView{w: stdout, prefix: c.prefix, shown: p.shown, live: !o.plain && !o.json && isTerminal(stdout), json: o.json}
	if !o.json && isTerminal(os.Stdin) {
		// q quits: read keys as they are typed (Ctrl-C stays a signal).
		var quit context.CancelFunc
		ctx, quit = context.WithCancel(ctx)
		defer quit()
		restore := keysMode(os.Stdin)
		defer restore()
		go readQuit(os.Stdin, quit)
	}
	read := func() (admin.Fleet, error) {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		return admin.ReadFleet(rctx, p.main, c.prefix, admin.ScanLimits{Limit: o.limit, MaxScan: o.maxScan})
	}
	fl, err := read()
	if err != nil {
		return err // Redis unreachable at the start: say so and exit
	}
	t.run(ctx, fl, read, o.interval.d, o.n)
	return nil
}

// run shows fl, then a fresh read every interval until ctx ends or n
// refreshes are shown (n 0: no limit). A read that fails keeps the last
// fleet on screen, under the error.
func (t *topView) run(ctx context.Context, fl admin.Fleet, read func() (admin.Fleet, error), interval time.Duration, n int) {
	t.begin()
	defer t.end()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var err error
	for i := 1; ; i++ {
		t.show(fl, err, time.Now())
		if n > 0 && i >= n {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		next, rerr := read()
		if ctx.Err() != nil {
			return
		}
		if err = rerr; err == nil {
			fl = next
		}
	}
}

// readQuit reads r until a q (or Q, or a Ctrl-C byte should the terminal
// pass it on) and then calls quit.
func readQuit(r io.Reader, quit func()) {
	b := make([]byte, 16)
	for {
		n, err := r.Read(b)
		for _, c := range b[:n] {
			if c == 'q' || c == 'Q' || c == 3 {
				quit()
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// topView draws the fleet: redrawn in place on a terminal (live), as plain
// lines, one block per refresh, or as one JSON document per refresh.
type topView struct {
	w      io.Writer
	prefix string
	shown  string // the Redis URL, password redacted
	live   bool
	json   bool
}

func (t *topView) begin() {
	if t.live {
		fmt.Fprint(t.w, "\x1b[?25l\x1b[H\x1b[2J") // hide the cursor, clear the screen
	}
}

func (t *topView) end() {
	if t.live {
		fmt.Fprint(t.w, "\x1b[?25h") // show the cursor
	}
}

// show draws one refresh; err is the read's error (the fleet is then the
// last one read).
func (t *topView) show(fl admin.Fleet, err error, now time.Time) {
	if t.json {
		_ = writeJSON(t.w, toFleetJSON(t.prefix, fl, err))
		return
	}
	rows := topRows(fl)
	var counts []string
	for _, c := range []struct {
		n         int
		one, many string
	}{{len(fl.Semaphores), "semaphore", "semaphores"}, {len(fl.RWMutexes), "lock", "locks"}, {len(fl.RateGates), "rate gate", "rate gates"}, {len(fl.Elections), "election", "elections"}} {
		if c.n > 0 {
			counts = append(counts, plural(c.n, c.one, c.many))
		}
	}
	if len(counts) == 0 {
		counts = []string{"no names"}
	}
	head := fmt.Sprintf("redsem top  %s  %s  prefix %q  %s",
		now.Format("15:04:05"), t.shown, t.prefix, strings.Join(counts, ", "))
	if fl.Truncated {
		head += "  (scan incomplete: raise --limit or --max-scan)"
	}
	lines := []string{head}
	if err != nil {
		lines = append(lines, "  error: "+oneLine(err))
	}
	for _, f := range fl.Failed {
		lines = append(lines, fmt.Sprintf("  %q (%s): %s", f.Name, f.Kind, oneLine(f.Err)))
	}
	lines = append(lines, formatRows(rows)...)
	if !t.live {
		fmt.Fprintln(t.w, strings.Join(lines, "\n"))
		fmt.Fprintln(t.w)
		return
	}
	h, w := termSize(t.w)
	if h > 2 && len(lines) > h-1 {
		hidden := len(lines) - (h - 2)
		lines = append(lines[:h-2], fmt.Sprintf("  ... %d more", hidden))
	}
	if w > 1 {
		// A line that wraps would push the view down a row, and the next
		// redraw from the top left would leave its tail behind.
		for i, l := range lines {
			if r := []rune(l); len(r) > w-1 {
				lines[i] = string(r[:w-2]) + "…"
			}
		}
	}
	var b strings.Builder
	b.WriteString("\x1b[H")
	for _, l := range lines {
		b.WriteString(l + "\x1b[K\n")
	}
	b.WriteString("\x1b[J")
	fmt.Fprint(t.w, b.String())
}

// topRow is one line of the view.
type topRow struct {
	name, kind                  string
	held, size, wait, free      int
	expired, stray              int
	oldest                      time.Duration
	sat                         float64
	showExpired, oldestIsPeriod bool
	lock                        bool // a read-write lock: no size, no free count
}

// topRows turns the fleet into rows sorted by saturation, then waiters,
// then name.
func topRows(fl admin.Fleet) []topRow {
	var rows []topRow
	for _, st := range fl.Semaphores {
		kind := "sem"
		if st.Size == 1 {
			kind = kindMutex
		}
		rows = append(rows, topRow{name: st.Name, kind: kind, held: len(st.Holders), size: st.Size,
			wait: st.Waiting, free: st.Available, expired: st.Expired(), stray: st.Stray,
			oldest: st.OldestHold(), showExpired: true})
	}
	for _, st := range fl.RateGates {
		rows = append(rows, topRow{name: st.Name, kind: "rate", held: st.Started, size: st.Limit,
			wait: st.Waiting, free: st.Available, stray: st.Stray, oldest: st.Per, oldestIsPeriod: true})
	}
	for _, st := range fl.RWMutexes {
		r := topRow{name: st.Name, kind: "rw", held: len(rwHolders(st)), wait: len(st.Queue), showExpired: true, lock: true}
		for _, h := range rwHolders(st) {
			if h.Expired {
				r.expired++
			}
			if !h.Acquired.IsZero() {
				r.oldest = max(r.oldest, st.ServerTime.Sub(h.Acquired))
			}
		}
		if st.Writer != nil {
			r.sat = 1
		}
		rows = append(rows, r)
	}
	for _, st := range fl.Elections {
		r := topRow{name: st.Name, kind: "elect", wait: st.Waiting, lock: true}
		if h := st.Leader; h != nil {
			r.held, r.sat = 1, 1
			r.oldest = st.ServerTime.Sub(h.Acquired)
		}
		rows = append(rows, r)
	}
	for i := range rows {
		if rows[i].size > 0 {
			rows[i].sat = float64(rows[i].held) / float64(rows[i].size)
		}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.sat != b.sat {
			return a.sat > b.sat
		}
		if a.wait != b.wait {
			return a.wait > b.wait
		}
		return a.name < b.name
	})
	return rows
}

// maxNameWidth caps the NAME column.
const maxNameWidth = 40

func formatRows(rows []topRow) []string {
	width := len("NAME")
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = shortName(r.name)
		width = max(width, len([]rune(names[i])))
	}
	line := func(name string, cols ...string) string {
		pad := width - len([]rune(name))
		return strings.TrimRight(fmt.Sprintf("%s%s  %-5s %5s %5s %5s %5s %5s %4s %5s  %s", name, strings.Repeat(" ", pad),
			cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6], cols[7], cols[8]), " ")
	}
	out := []string{line("NAME", "KIND", "HELD", "SIZE", "SAT", "WAIT", "FREE", "EXP", "STRAY", "OLDEST")}
	for i, r := range rows {
		exp, oldest := "-", "-"
		if r.showExpired {
			exp = fmt.Sprint(r.expired)
		}
		switch {
		case r.oldestIsPeriod:
			oldest = "per " + perText(r.oldest)
		case r.oldest > 0:
			oldest = r.oldest.Round(time.Second).String()
			if r.oldest < time.Second {
				oldest = r.oldest.Round(time.Millisecond).String()
			}
		}
		size, sat, free := fmt.Sprint(r.size), fmt.Sprintf("%.0f%%", 100*r.sat), fmt.Sprint(r.free)
		if r.lock {
			size, free = "-", "-"
			if r.sat == 0 {
				sat = "-"
			}
		}
		out = append(out, line(names[i], r.kind, fmt.Sprint(r.held), size, sat, fmt.Sprint(r.wait), free, exp,
			fmt.Sprint(r.stray), oldest))
	}
	return out
}

// shortName makes a name printable on one line of at most maxNameWidth
// characters.
func shortName(name string) string {
	q := name
	if strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f || r == '\uFFFD' }) ||
		strings.TrimSpace(name) != name {
		q = fmt.Sprintf("%q", name)
	}
	if r := []rune(q); len(r) > maxNameWidth {
		q = string(r[:maxNameWidth-1]) + "…"
	}
	return q
}
