//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/rate"
)

const rateHelp = `Usage: redsem rate set [--create] [connection flags] NAME LIMIT [LIMIT...]
       redsem rate status [--json] [connection flags] NAME

rate set sets the limits of rate gate NAME for every client at once. A NAME
with no rate gate is an error, so that a typo does not make one: exit 66, or
65 when NAME is another kind (a semaphore, a lock); --create makes the gate,
beside another kind too. LIMIT is N/PER: at most N units in any
window of length PER. PER is a duration (1s, 1m, 250ms, 1m30s) or a bare
unit meaning one of it (s, m, h, ms): 5/s, 100/1m, 20/250ms. A quota of
several limits takes one LIMIT per limit, in its order. From then on every
client follows the stored limits, whatever it was started with. Waiters are
re-timed at once; those asking for more than a lowered N fail.
docs/rate-gate.md states the rule a start is held to across a change.

rate status shows the gate: its limits, the starts in the current window,
the starts possible now and the waiters (as redsem status NAME does for a
gate). A gate that does not exist is not an error: it says so, exit 0.

  --create         (set) make rate gate NAME if it has none
  --json           (status) print JSON, in the style of redsem status --json

To rate-gate a command, see redsem run --rate.

` + connHelp + `
Examples:
  redsem rate set --create partner-api 50/s
  redsem rate set llm-api 500/1m 300000/1m
  redsem rate status --json partner-api | jq .available
`

func cmdRate(args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("rate")
	var c connFlags
	c.register(fs)
	asJSON := fs.Bool("json", false, "")
	create := fs.Bool("create", false, "")
	pos, err := parseArgs(fs, args, rateHelp)
	if err != nil {
		return err
	}
	switch {
	case len(pos) >= 1 && pos[0] == "status":
		if len(pos) != 2 {
			return usagef("rate: expected status NAME (see redsem rate --help)")
		}
		if *create {
			return usagef("rate: --create is for rate set")
		}
		return rateStatus(c, pos[1], *asJSON, stdout)
	case len(pos) < 3 || pos[0] != "set":
		return usagef("rate: expected set NAME LIMIT... or status NAME (see redsem rate --help)")
	case *asJSON:
		return usagef("rate: --json is for rate status")
	}
	name := pos[1]
	var limits []rate.Limit
	for _, s := range pos[2:] {
		l, err := parseLimit(s)
		if err != nil {
			return usagef("rate: %v", err)
		}
		limits = append(limits, l)
	}
	adm, p, err := openAdmin(c, name)
	if err != nil {
		return err
	}
	defer p.Close()
	q, err := rate.NewQuota(p.main, name, limits, rate.WithPrefix(c.prefix))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	n := &named{adm: adm, pool: p.main, prefix: c.prefix, name: name}
	if n.kinds, err = adm.Kinds(ctx); err != nil {
		return err
	}
	if !n.has(admin.KindRate) && !*create {
		again := fmt.Sprintf("rate set --create %s %s", shellQuote(name), strings.Join(pos[2:], " "))
		if len(n.kinds) > 0 {
			return notFor("rate set", name, n.kinds[0], fmt.Sprintf("it has no rate gate (%s makes one beside it)", again))
		}
		return exitf(exitNoName, "rate set: no rate gate %q under prefix %q (%s makes one)", name, c.prefix, again)
	}
	// Between the look-up and the change the gate could be deleted, and
	// the change would then create it: a window of one round trip.
	if err := q.SetLimits(ctx, limits...); err != nil {
		return err
	}
	if !n.has(admin.KindRate) {
		fmt.Fprintf(stdout, "created rate gate %q, which admits %s\n", name, limitList(limits))
		return nil
	}
	fmt.Fprintf(stdout, "%q now admits %s\n", name, limitList(limits))
	return nil
}

// rateStatus is rate status NAME.
func rateStatus(c connFlags, name string, asJSON bool, stdout io.Writer) error {
	adm, p, err := openAdmin(c, name)
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	st, err := rate.ReadStatus(ctx, p.main, c.prefix, name)
	if err != nil {
		return wrongTypeHint(err, name)
	}
	if !st.Exists {
		kinds, err := adm.Kinds(ctx)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(stdout, noneJSON{Kind: kindNone, Name: name, Kinds: kindNames(kinds)})
		}
		fmt.Fprintf(stdout, "%q does not exist (no rate gate of that name under prefix %q)\n", name, c.prefix)
		if len(kinds) > 0 {
			fmt.Fprintln(stdout, alsoLine(name, kinds))
		}
		return nil
	}
	if asJSON {
		doc := toRateStatusJSON(st)
		if kinds, err := adm.Kinds(ctx); err == nil {
			doc.Kinds = kindNames(kinds)
		}
		return writeJSON(stdout, doc)
	}
	printRateStatus(stdout, st)
	return nil
}

func printRateStatus(w io.Writer, st rate.Status) {
	if !st.Exists {
		fmt.Fprintf(w, "rate gate %q does not exist (the first start creates it)\n", st.Name)
		return
	}
	fmt.Fprintf(w, "rate       %s\n", st.Name)
	fmt.Fprintf(w, "limit      %s\n", limitsText(st))
	if len(st.Limits) <= 1 {
		fmt.Fprintf(w, "started    %d in the last %s\n", st.Started, perText(st.Per))
		fmt.Fprintf(w, "available  %d now\n", st.Available)
	} else {
		for i, l := range st.Limits {
			fmt.Fprintf(w, "limit #%d   %d/%s: started %d, available %d now\n", i+1, l.N, perText(l.Per), l.Started, l.Available)
		}
	}
	fmt.Fprintf(w, "waiting    %d\n", st.Waiting)
	if st.Stray > 0 || st.Rejected > 0 {
		fmt.Fprintf(w, "stray      %d (rejected so far: %d)\n", st.Stray, st.Rejected)
	}
	if st.Set {
		fmt.Fprintf(w, "set        by redsem rate set %s ago: every client follows it\n",
			st.ServerTime.Sub(st.Changed).Round(time.Second))
	}
}

// limitsText writes a gate's limits in the form rate set takes: "5/1s and
// 100/1m".
func limitsText(st rate.Status) string {
	if len(st.Limits) == 0 {
		return fmt.Sprintf("%d/%s", st.Limit, perText(st.Per))
	}
	ls := make([]rate.Limit, len(st.Limits))
	for i, l := range st.Limits {
		ls[i] = l.Limit
	}
	return limitList(ls)
}

// limitList writes limits for people: "50 per 1s and 100 per 1m".
func limitList(ls []rate.Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = fmt.Sprintf("%d per %s", l.N, perText(l.Per))
	}
	return strings.Join(parts, " and ")
}

// perText writes an interval without Go's trailing zero units: 1m, not
// 1m0s; 1h30m, not 1h30m0s.
func perText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// limitForm is what a limit looks like, for the messages.
const limitForm = "a limit N/PER such as 5/s, 100/1m or 20/250ms"

// parseLimit reads N/PER, PER a duration (1s, 250ms, 1m30s) or a bare unit
// (s, m, h, ms, us) that means one of it.
func parseLimit(s string) (rate.Limit, error) {
	l, why := readLimit(s)
	if why != "" {
		return l, fmt.Errorf("%q is not %s%s", s, limitForm, why)
	}
	return l, nil
}

// readLimit is parseLimit; why is empty, or says what is wrong.
func readLimit(s string) (rate.Limit, string) {
	n, per, ok := strings.Cut(s, "/")
	if !ok {
		return rate.Limit{}, ": no /"
	}
	var l rate.Limit
	var err error
	if l.N, err = strconv.Atoi(n); err != nil {
		return rate.Limit{}, fmt.Sprintf(": N %q is not a whole number", n)
	}
	unit := per
	if per != "" && (per[0] >= 'a' && per[0] <= 'z' || per[0] >= 'A' && per[0] <= 'Z') {
		per = "1" + per // "s" is "1s"
	}
	if l.Per, err = time.ParseDuration(per); err != nil {
		return rate.Limit{}, fmt.Sprintf(": PER %q is not a duration", unit)
	}
	switch {
	case l.N < 1 || l.N > rate.MaxN:
		return rate.Limit{}, fmt.Sprintf(": N must be from 1 to %d", rate.MaxN)
	case l.Per < time.Millisecond || l.Per > rate.MaxPer:
		return rate.Limit{}, fmt.Sprintf(": PER must be from 1ms to %s", perText(rate.MaxPer))
	}
	return l, ""
}

// limitsValue is a repeatable flag of limits (run --rate).
type limitsValue struct{ ls []rate.Limit }

func (v *limitsValue) String() string { return limitList(v.ls) }

func (v *limitsValue) Set(s string) error {
	l, why := readLimit(s)
	if why != "" {
		return errors.New("not " + limitForm + why)
	}
	v.ls = append(v.ls, l)
	return nil
}
