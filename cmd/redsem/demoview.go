//go:build unix

package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// view shows the demo: a live panel redrawn in place on a terminal, or one
// line per event otherwise.
type view struct {
	w        io.Writer
	o        *demoOptions
	t        *tracker
	live     bool
	lines    int // lines drawn last time, to move back over them
	stopCh   chan struct{}
	finished chan struct{}
}

func newView(w io.Writer, o *demoOptions, t *tracker, name, where string) *view {
	v := &view{w: w, o: o, t: t, live: !o.plain && isTerminal(w)}
	fmt.Fprintf(w, "redsem demo: %d workers x %d rounds through semaphore %q of size %d (%s)\n",
		o.workers, o.rounds, name, o.size, where)
	if !v.live {
		t.onEvent = func(line string) { fmt.Fprintln(w, line) }
	}
	return v
}

// isTerminal reports whether w is a character device with a usable TERM.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	term := os.Getenv("TERM")
	return term != "" && term != "dumb"
}

func (v *view) start() {
	if !v.live {
		return
	}
	v.stopCh, v.finished = make(chan struct{}), make(chan struct{})
	fmt.Fprint(v.w, "\x1b[?25l") // hide the cursor
	go func() {
		defer close(v.finished)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			v.draw()
			select {
			case <-v.stopCh:
				v.draw()
				return
			case <-tick.C:
			}
		}
	}()
}

func (v *view) stop() {
	if !v.live {
		return
	}
	close(v.stopCh)
	<-v.finished
	fmt.Fprint(v.w, "\x1b[?25h") // show the cursor
}

func (v *view) draw() {
	lines := v.render()
	var b strings.Builder
	if v.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", v.lines)
	}
	for _, l := range lines {
		b.WriteString("\x1b[2K" + l + "\n")
	}
	v.lines = len(lines)
	fmt.Fprint(v.w, b.String())
}

// render returns the panel: one line per slot, then progress.
func (v *view) render() []string {
	t := v.t
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []string
	now := time.Now()
	for s := 1; s <= v.o.size; s++ {
		h, ok := t.slots[strconv.Itoa(s)]
		if !ok {
			lines = append(lines, fmt.Sprintf("  slot %3d  %-10s   %s", s, "free", strings.Repeat("·", 20)))
			continue
		}
		frac := float64(now.Sub(h.since)) / float64(h.hold)
		lines = append(lines, fmt.Sprintf("  slot %3d  %-10s  %s  fence %d", s,
			fmt.Sprintf("worker %d", h.worker), bar(frac, 20), h.fence))
	}
	lines = append(lines, "",
		fmt.Sprintf("  done %d/%d %s  holding %d/%d  waiting %d  max seen %d/%d  %.1fs",
			t.done, t.total, bar(float64(t.done)/float64(t.total), 30),
			t.cur, v.o.size, t.wait, t.max, v.o.size, time.Since(t.start).Seconds()))
	return lines
}

// bar draws frac (0..1) as a bar of n cells.
func bar(frac float64, n int) string {
	k := int(frac * float64(n))
	k = max(0, min(n, k))
	return "[" + strings.Repeat("█", k) + strings.Repeat("░", n-k) + "]"
}
